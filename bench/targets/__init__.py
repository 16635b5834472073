"""Reference servers with the benchmark's contract (see bench/functions/bench_handlers.py)."""
