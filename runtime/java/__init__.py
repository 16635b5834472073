"""Java functions (`runtime: java8|11|17|21`): the SDK's sources, their compilation, the worker JVMs.

The SDK (org.yuanrong.services.runtime.*) and the worker program live in `sdk/` as Java sources
and are compiled with the installed JDK on first use, into a cache keyed by their content.
"""
