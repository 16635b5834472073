"""A handler reporting every stream name the handler API shows it: they must be its own names."""
from runtime import (
    ProducerConfig,
    StreamError,
    SubscriptionConfig,
    create_stream_consumer,
    create_stream_producer,
    delete_stream,
)


def shown_names(event, context):
    """The producer's and consumer's names, and the messages of the stream errors it provokes."""
    name = event["stream"]
    seen = {}
    with create_stream_producer(name, ProducerConfig(delay_flush_time=0, retain_num=5)) as producer:
        producer.send(b"x")
        seen["producer"] = producer.name
        consumer = create_stream_consumer(name, SubscriptionConfig(from_id=0))
        seen["consumer"] = consumer.name
        try:
            create_stream_consumer(name, SubscriptionConfig(from_id=99))
        except StreamError as exc:
            seen["bad_id"] = str(exc)
        delete_stream(name)
        for _ in range(3):  # the retained element first, then the deletion
            try:
                consumer.receive(1000)
            except StreamError as exc:
                seen["deleted"] = str(exc)
                break
    try:
        producer.send(b"late")
    except StreamError as exc:
        seen["closed"] = str(exc)
    return seen
