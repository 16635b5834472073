"""bench.jobs still runs end to end on a real server (no figures asserted: they come from the script)."""
from bench.jobs import measure


def test_bench_jobs_runs():
    result = measure(jobs=20, samples=3, store="sqlite")
    assert result["jobs_submitted_per_s"] > 0 and result["first_item_ms_p50"] > 0
