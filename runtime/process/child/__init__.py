"""The program that runs inside a worker process, on the far side of the socket from its pool.

Started as `python -m runtime.process.worker FD` (runtime/process/worker.py); nothing here imports
the registry, the pool or aiohttp (tests/runtime/test_imports.py checks), so a worker loads only
what running one function's code needs.
"""
