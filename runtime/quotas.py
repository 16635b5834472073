"""Deploy-time quotas: what one tenant may deploy and how many worker processes deploys may keep.

Checked before any code is imported or worker started, and again at commit (another deploy may
have committed meanwhile), so a refused deploy costs nothing: `tenants.maxFunctions` functions
per tenant, `tenants.maxInstancesPerFunction` for a process function's `instances`,
`minInstances` and `maxInstances`, and `runtime.maxWorkerProcesses` for the workers every
process function keeps running (their `minInstances`, summed over the node).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from .deployment import function_key
from .errors import FunctionServiceError
from .executors import kind_of
from .manifest import FunctionSpec

__all__ = ("Quotas", "QuotaError")


class QuotaError(FunctionServiceError):
    """A deploy would go past a quota (the deploy is refused whole; nothing was started)."""

    code, status = 200429, 429


def _kept(spec: FunctionSpec) -> int:
    """Workers a pooled function (process, Java) keeps running (its minInstances; `instances` fixes it)."""
    kind = kind_of(spec)
    if kind is None or not kind.pooled:
        return 0
    if spec.instances is not None:
        return spec.instances
    return 1 if spec.minInstances is None else spec.minInstances


@dataclass(frozen=True, slots=True)
class Quotas:
    max_functions: int | None = None           # per tenant
    max_instances: int | None = None           # per function: instances, minInstances, maxInstances
    max_worker_processes: int | None = None    # per node: the sum of process functions' kept workers

    def check(self, specs: Iterable[FunctionSpec], deployed: dict[str, FunctionSpec]) -> None:
        """QuotaError (429) or, for one function asking past the per-function cap, 400; `deployed`:
        key -> spec of what is deployed now (a redeploy replaces its own key)."""
        specs = list(specs)
        if self.max_instances is not None:
            for spec in specs:
                asked = max(spec.instances or 0, spec.minInstances or 0, spec.maxInstances or 0)
                if asked > self.max_instances:
                    raise FunctionServiceError(
                        f"function {spec.name!r}: at most {self.max_instances} instances per function "
                        f"(tenants.maxInstancesPerFunction); it asks {asked}", code=200400, status=400)
        after = dict(deployed)
        after.update((function_key(s.tenant, s.name), s) for s in specs)
        if self.max_functions is not None:
            count = Counter(s.tenant for s in after.values())
            for tenant in dict.fromkeys(s.tenant for s in specs):
                if count[tenant] > self.max_functions:
                    raise QuotaError(f"this deploy would give the tenant {count[tenant]} functions; at most "
                                     f"{self.max_functions} (tenants.maxFunctions)")
        if self.max_worker_processes is not None and any(_kept(s) for s in specs):
            kept = sum(_kept(s) for s in after.values())
            if kept > self.max_worker_processes:
                raise QuotaError(f"this deploy would keep {kept} worker processes running on this node; at "
                                 f"most {self.max_worker_processes} (runtime.maxWorkerProcesses)")
