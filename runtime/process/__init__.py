"""Worker processes: run a function's handlers isolated, in parallel, with hard limits.

`pool` supervises one deployment's workers, `executor` runs invocations on them, `protocol` is
the frame format both ends speak and `worker` is the process's main program. This package
imports none of them itself: the worker process imports `worker` alone, without its supervisor.
"""
