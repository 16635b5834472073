"""openYuanrong's `yr.stream` module: where its stream configs live, and the only place its
`SubscriptionType` is importable from (`from yr.stream import SubscriptionType`)."""
from __future__ import annotations

from runtime.streams import Element, ProducerConfig, SubscriptionConfig, SubscriptionType

__all__ = ("Element", "ProducerConfig", "SubscriptionConfig", "SubscriptionType")
