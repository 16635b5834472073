"""The shim's stream configs take openYuanrong's arguments in openYuanrong's order (its `yr/stream`
dataclasses), so code written for it positionally runs unchanged; fnstream's own fields follow,
keyword-only, so they can never shift a positional argument."""
from __future__ import annotations

import dataclasses

import pytest

from runtime.streams import ProducerConfig, SubscriptionConfig, SubscriptionType

# openYuanrong's field order (yr's stream.py).
YR_PRODUCER = ["delay_flush_time", "page_size", "max_stream_size", "auto_clean_up", "encrypt_stream",
               "retain_for_num_consumers", "reserve_size", "extend_config"]
YR_SUBSCRIPTION = ["subscription_name", "subscriptionType", "extend_config"]


def _positional(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if not f.kw_only]


def test_positional_fields_are_openyuanrongs_in_its_order() -> None:
    assert _positional(ProducerConfig) == YR_PRODUCER
    assert _positional(SubscriptionConfig) == YR_SUBSCRIPTION


def test_openyuanrong_calls_mean_what_they_mean_there() -> None:
    sub = SubscriptionConfig("sub-a")
    assert sub.subscription_name == "sub-a" and sub.subscriptionType is SubscriptionType.STREAM
    assert SubscriptionConfig("s", SubscriptionType.STREAM, {"k": "v"}).extend_config == {"k": "v"}
    assert SubscriptionConfig("s", "STREAM").subscriptionType is SubscriptionType.STREAM
    producer = ProducerConfig(0, 4096, 1 << 20, False, False, 2)
    assert (producer.delay_flush_time, producer.page_size, producer.retain_for_num_consumers) == (0, 4096, 2)


@pytest.mark.parametrize("kind", [SubscriptionType.ROUND_ROBIN, SubscriptionType.KEY_PARTITIONS, "ROUND_ROBIN"])
def test_unsupported_subscription_types_are_refused(kind: SubscriptionType | str) -> None:
    with pytest.raises(ValueError, match="not supported"):
        SubscriptionConfig("s", kind)


def test_fnstream_fields_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        SubscriptionConfig("s", SubscriptionType.STREAM, {}, 5)  # type: ignore[misc]
    assert SubscriptionConfig("s", from_id=5).from_id == 5
