"""Returns its event unchanged."""


def handler(event, context):
    return event
