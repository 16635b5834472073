"""A RunPod worker that asks for a refresh in its output (`refresh_worker` key), when told to."""
import runpod

instance = {"jobs": 0}


def handler(job):
    instance["jobs"] += 1
    out = {"jobs_seen_by_this_instance": instance["jobs"]}
    if job["input"].get("refresh"):
        out["refresh_worker"] = True
    return out


runpod.serverless.start({"handler": handler})
