"""Background jobs: model, stores, runner, webhooks, RunPod-style handlers (see docs/jobs.md)."""
