def handler(event, context):
    return "v2"
