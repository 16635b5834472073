"""A stand-in engine, as RunPod LLM workers have one: an async generator of token batches."""
import asyncio
import os


class Engine:
    async def generate(self, prompt, n):
        for i in range(n):
            await asyncio.sleep(0)
            yield {"token": f"{prompt}-{i}"}

    async def hold(self, path):
        """Until the test creates `path` (a job that keeps its slot while the test looks)."""
        while not await asyncio.to_thread(os.path.exists, path):
            await asyncio.sleep(0.01)
