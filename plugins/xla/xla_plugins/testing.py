"""Test aids of the XLA plugin: the runtime test double and the test switch of the spawn strategy.

The plugin's runtime adapter (:func:`xla_plugins.runtime._probes.runtime_figures`) and its refusal of the
one-worker-per-device strategy on PJRT CPU (:func:`xla_plugins.runtime._probes.spawn_collectives_hang`)
ask this module whether a test changed them; nothing else in the plugin knows about tests.
Importing this module imports neither torch nor torch_xla.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Optional

from xla_plugins.runtime._world import RuntimeFigures

#: Test switch: ``1`` lets the one-worker-per-device strategy run on PJRT CPU although its collectives
#: would hang with this torch_xla. Only for a process that re-lowered the collectives itself, as the
#: project's test harness (``tests/xla_cpu_harness.py``) does; documented in docs/testing.md.
CPU_SPAWN_TEST_SWITCH = "XLA_PLUGINS_TEST_CPU_SPAWN"

#: The test double's figures source while :func:`simulated_runtime` is active (``None``: torch_xla's).
_figures_source: Optional[Callable[[], RuntimeFigures]] = None


def cpu_spawn_switched_on() -> bool:
    """Whether :data:`CPU_SPAWN_TEST_SWITCH` is ``1`` (any other value, or none, leaves the refusal on)."""
    return os.environ.get(CPU_SPAWN_TEST_SWITCH) == "1"


@contextlib.contextmanager
def simulated_runtime(source: Callable[[], RuntimeFigures]) -> Iterator[None]:
    """Make :func:`~xla_plugins.runtime._probes.runtime_figures` return ``source()``: a multi-host slice's test double.

    No TPU pod is needed to test what the strategies do on one: inside this context every world
    size, rank and data share the plugin computes comes from ``source`` (called on every read, so it
    may answer per thread). torch_xla itself is not touched: devices, graphs and collectives stay
    real. Nested use restores the outer source on exit.

    Args:
        source: a callable returning the simulated :class:`~xla_plugins.runtime._world.RuntimeFigures`.
    """
    global _figures_source
    outer, _figures_source = _figures_source, source
    try:
        yield
    finally:
        _figures_source = outer


def simulated_figures() -> Optional[RuntimeFigures]:
    """The figures of the active :func:`simulated_runtime` (``None`` outside one: torch_xla's are read)."""
    return _figures_source() if _figures_source is not None else None
