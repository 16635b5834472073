"""Which configuration `fnstream serve` / `worker` run on when no `--config` is given.

`./config/default.yaml` when the current directory has one (a project made by `fnstream init`, or
the checkout); otherwise the built-in defaults shipped in the package, read as if they were
`./config/default.yaml` — so `./deploy` and `./functions` are used when present, and with no deploy
directory the server starts with no functions (and says how to add one) rather than failing.
"""
from __future__ import annotations

from pathlib import Path

from runtime.config import Config, load_config, packaged_default_config

__all__ = ("NO_FUNCTIONS_HINT", "load_cli_config")

NO_FUNCTIONS_HINT = ("fnstream: no functions deployed (no deploy directory at {deploy}). Add one with "
                     "`fnstream new hello` (or `fnstream init` for a whole project) and restart, or "
                     "`fnstream deploy FILE` against this server.")


def load_cli_config(config: str | None, overrides: list[str], cwd: Path | None = None) -> Config:
    """The config named by `--config`, else the local project's, else the built-in defaults."""
    if config is not None:
        return load_config(config, overrides)
    here = (cwd or Path.cwd()).resolve()
    local = here / "config" / "default.yaml"
    if local.is_file():
        return load_config(local, overrides)
    cfg = load_config(packaged_default_config(), overrides, base_dir=here / "config")
    explicit = any(o.partition("=")[0].strip() == "runtime.deployDir" for o in overrides)
    if not explicit and cfg.runtime.deployDir is not None and not cfg.runtime.deployDir.is_dir():
        cfg.runtime.deployDir = None  # built-in defaults, no ./deploy: start empty
    return cfg
