"""A RunPod worker file as RunPod workers are written: an async generator over an engine, the
start call at the bottom of the module (not under `if __name__ == "__main__"`)."""
import runpod
from rp_worker_engine import Engine

engine = Engine()


async def handler(job):
    job_input = job["input"]
    if "progress" in job_input:
        runpod.serverless.progress_update(job, job_input["progress"])
    if "hold" in job_input:
        await engine.hold(job_input["hold"])
    async for batch in engine.generate(job_input.get("prompt", "t"), job_input.get("n", 3)):
        yield batch


runpod.serverless.start({"handler": handler, "concurrency_modifier": lambda n: 2,
                         "return_aggregate_stream": True})
