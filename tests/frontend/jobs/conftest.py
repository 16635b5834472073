"""Fixtures of the job tests: an in-process server with the job test handlers deployed."""
from __future__ import annotations

import pytest

from tests.support.servers import fn, test_config

JOB_FUNCTIONS = [
    fn("echo-job", "job_fns.echo"),
    fn("count", "job_fns.count", concurrency=4),
    fn("acount", "job_fns.acount"),
    fn("ollama", "job_fns.ollama_style", rawStream=True),
    fn("sleeper", "job_fns.sleeper", concurrency=1),
    fn("sync-sleeper", "job_fns.sync_sleeper", concurrency=1, timeout=30),
    fn("error-dict", "job_fns.error_dict"),
    fn("yields-error", "job_fns.yields_error"),
    fn("raises", "job_fns.raises"),
    fn("big", "job_fns.big"),
    fn("writer", "job_fns.writes_then_returns"),
    fn("uses-yr", "job_fns.uses_yr"),
    fn("uses-yr-sync", "job_fns.uses_yr_sync"),
    fn("log-ids", "job_fns.log_ids"),
]


@pytest.fixture
def job_config(deploy_dir):
    """Factory: the test config with the job handlers deployed and `overrides` applied. A short
    shutdown grace: a test that leaves a job sleeping would otherwise wait out the default 10 s."""

    def factory(**overrides):
        return test_config(deploy_dir(*JOB_FUNCTIONS), **{"frontend.args.enableEvent": True,
                                                          "frontend.args.shutdownGraceSeconds": 0.5, **overrides})

    return factory


@pytest.fixture
async def jobs(make_client, job_config):
    return await make_client(config=job_config())
