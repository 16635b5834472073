"""YAML for untrusted manifests: no aliases, bounded depth and size, safe tags only.

An alias bomb (a few hundred bytes that expand to gigabytes) and a document nested thousands of
levels deep (RecursionError) are refused while composing, before anything is built. Manifests
need neither anchors nor deep nesting, so both are refused outright with a clear message.
"""
from __future__ import annotations

from typing import Any

import yaml

__all__ = ("load_untrusted", "MAX_DEPTH", "MAX_MANIFEST_BYTES", "UnsafeYAMLError")

MAX_DEPTH = 64                     # a manifest is a list of maps of (small) maps
MAX_MANIFEST_BYTES = 1024 * 1024   # far above any real manifest


class UnsafeYAMLError(yaml.YAMLError):
    """The text uses something manifests refuse (an alias, too deep, too large)."""


class _LimitedLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases and counts nesting while it composes nodes."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]
        line: int = event.start_mark.line + 1
        if type(event) is yaml.AliasEvent:
            raise UnsafeYAMLError(f"YAML aliases (*{event.anchor}) are not allowed in manifests (line {line})")
        if getattr(event, "anchor", None) is not None:
            raise UnsafeYAMLError(f"YAML anchors (&{event.anchor}) are not allowed in manifests "
                                  f"(line {event.start_mark.line + 1})")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise UnsafeYAMLError(f"the document is nested more than {MAX_DEPTH} levels deep "
                                      f"(line {event.start_mark.line + 1})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_untrusted(text: str) -> Any:
    """`yaml.safe_load` with the limits above; raises yaml.YAMLError (UnsafeYAMLError for a limit)."""
    if len(text) > MAX_MANIFEST_BYTES:
        raise UnsafeYAMLError(f"the document is {len(text)} characters; at most {MAX_MANIFEST_BYTES} are accepted")
    loader = _LimitedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
