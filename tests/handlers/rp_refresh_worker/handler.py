"""A RunPod worker with refresh_worker: every job finds a fresh instance (module state)."""
import runpod

instance = {"jobs": 0}


def handler(job):
    instance["jobs"] += 1
    return {"jobs_seen_by_this_instance": instance["jobs"]}


runpod.serverless.start({"handler": handler, "refresh_worker": True})
