"""fnstream benchmarks: a load client, reference servers and a runner (`python -m bench.run`)."""
