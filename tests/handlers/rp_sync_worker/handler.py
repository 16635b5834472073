"""A RunPod worker with a plain generator and no return_aggregate_stream: /run and /runsync
outputs hold no items (they are read with /stream), as on RunPod."""
import runpod


def handler(job):
    for i in range(job["input"]["n"]):
        yield f"item-{i}"


runpod.serverless.start({"handler": handler})
