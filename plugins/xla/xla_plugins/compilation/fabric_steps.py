"""The compile monitor for Fabric: compilations and host reads in the training steps of a Fabric loop.

Fabric has no loop of its own and no profiler actions: the user writes the loop. Its steps are
seen through the XLA precision plugin, which Fabric calls at each of them
(:class:`~xla_plugins.roles.precision.FabricXLAPrecision`): the wrapped module's forward
(``convert_input``, then ``forward_context``) and ``optimizer.step()`` (``optimizer_step``: torch_xla's
``xm.optimizer_step(barrier=True)``, where the step's graph runs, and compiles the first time). The
backward pass is left unwatched: a precision plugin that overrides ``backward`` makes Fabric refuse
``loss.backward()``. The phases (:data:`STEP`, :data:`FORWARD`, :data:`OPTIMIZER_STEP`):

* a **training step** runs from the first forward with gradients enabled after an optimizer step
  to the end of the next ``optimizer.step()``; the forward and the optimizer step are phases inside
  it, and the backward pass is part of the step itself. A host read from the user's code in it
  (``loss.item()`` between forward and ``optimizer.step()``, say) is a read inside a step;
* a forward with gradients disabled (an evaluation loop under ``torch.no_grad()``) is a forward
  outside any step: its compilations and reads are counted, and reported only for new input shapes.

The rules are the Trainer's (:mod:`xla_plugins.compilation.compile_monitor`): the first ``WARMUP_CALLS`` calls
of each phase are its warm-up, then a compilation or a read from the user's code inside a step is
reported once per cause, or raised with ``XLA_PLUGINS_RECOMPILES=error``. A compilation names the
user's line that called the module's forward at the start of the step. Fabric has no end of a run,
so the summary is printed by global rank 0 when the process exits (``atexit``; in a worker of the
spawn strategy, when its function returns) and is available at any time from
:meth:`FabricCompileMonitor.finish` (``fabric.strategy.compile_monitor``).
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import weakref
from typing import Any, Optional

import torch

from xla_plugins.compilation import compile_cache
from xla_plugins.compilation.compile_monitor import CompileMonitor
from xla_plugins.compilation.host_reads import OWN, SourceLine, unwrap_reads, user_frame, wrap_reads
from xla_plugins.compilation.loop_phases import FABRIC, Phase
from xla_plugins.compilation.recompile_budget import budget

#: The phases of a Fabric loop (profiler-style action names; see the module docstring).
STEP, FORWARD, OPTIMIZER_STEP = (f"{FABRIC}{hook}" for hook in ("step", "forward", "optimizer_step"))

#: The monitors installed in this process, each with the thread that installed it (see :func:`finish_this_thread`).
_installed: list[tuple[int, weakref.ref]] = []


class FabricCompileMonitor(CompileMonitor):
    """Counts compilations and host reads in a Fabric loop's steps; reports late ones (see the module docstring).

    Built by :func:`install`; the precision plugin calls :meth:`forward_called`, :meth:`enter` and
    :meth:`leave` at the boundaries.

    Args:
        budget: ``"warn"`` or ``"error"``.
        strategy: the Fabric strategy whose steps are watched (for ``is_global_zero``).
    """

    _step_of_loop = {"training": "step", "evaluation": "forward"}
    _step_hooks = frozenset({"step"})
    _outside_label = "outside the training steps"

    def __init__(self, budget: str, strategy: Any) -> None:
        super().__init__(budget)
        self._start_run(weakref.proxy(strategy))
        self._step_open = False
        #: (file, line) of the user's call of the module's forward that opened the current step
        self._step_line: Optional[SourceLine] = None
        self._finished = False

    def forward_called(self, data: Any) -> None:
        """The wrapped module's forward is called with ``data`` (its ``(args, kwargs)``): open a step if training."""
        if not torch.is_grad_enabled():
            self._batch_starts()
            self._on_batch("evaluation", data)
            return
        if not self._step_open:
            # an evaluation forward whose graph never ran (nothing read) compiled nothing: its shapes explain nothing
            self._new_shapes = [entry for entry in self._new_shapes if entry.loop == "training" and not entry.explained]
            self.enter(STEP)
            self._step_open = True
            frame = user_frame(sys._getframe(1), through=OWN)
            self._step_line = None if frame is None else SourceLine.of_frame(frame)
        self._on_batch("training", data)

    def optimizer_stepped(self) -> None:
        """``optimizer.step()`` returned: the training step ends (its graph ran inside it)."""
        if self._step_open:
            self._step_open = False
            self.leave(STEP)

    def _step_of_phase(self, phase: Phase) -> Optional[str]:
        return "step" if phase.hook in ("forward", "optimizer_step") and self._step_open else None

    def _step_label(self, step_hook: str) -> str:
        return Phase(f"{FABRIC}{step_hook}").label

    def _compilation_line(self, phase: Phase, step_hook: Optional[str]) -> Optional[SourceLine]:
        return self._step_line

    def _done(self, trainer: Any) -> str:
        steps = self.summary["steps"]
        return f"Fabric loop of {steps} training step{'s' if steps != 1 else ''} (optimizer.step() calls)"

    def finish(self) -> dict[str, Any]:
        """Count the rest and return the summary (:attr:`summary`); the first call prints it on global rank 0
        (unless nothing ran: no step, no compilation).

        Also called at the process's exit. Reads in this thread stop going through the monitor; the read
        methods of ``torch.Tensor`` are given back once no thread has a monitor
        (:func:`~xla_plugins.compilation.host_reads.unwrap_reads`).
        """
        self._flush()
        self.summary = self._summarize("fabric")
        if not self._finished:
            self._finished = True
            unwrap_reads()
            if self.summary["steps"] or self.summary["compilations"]:
                self._log_summary(None)
            compile_cache.warn_if_unreadable()
        return self.summary


def install(strategy: Any) -> Optional[FabricCompileMonitor]:
    """Watch the steps of ``strategy``'s Fabric loop unless the budget is ``off``; idempotent per strategy.

    Args:
        strategy: a Fabric XLA strategy whose ``precision`` is a
            :class:`~xla_plugins.roles.precision.FabricXLAPrecision`, with an optional ``recompiles`` attribute.

    Returns:
        The monitor (also ``strategy.compile_monitor``), or ``None`` when the budget is ``off``.

    Raises:
        ValueError: ``XLA_PLUGINS_RECOMPILES`` or the strategy's ``recompiles`` is not a budget.
    """
    monitor = getattr(strategy, "compile_monitor", None)
    if monitor is not None:
        return monitor
    chosen = budget(getattr(strategy, "recompiles", None))
    if chosen == "off":
        return None
    monitor = FabricCompileMonitor(chosen, strategy)
    strategy.compile_monitor = monitor
    strategy.precision.step_boundaries = monitor
    wrap_reads(monitor)
    atexit.register(_finish_at_exit, weakref.ref(monitor))
    _installed.append((threading.get_ident(), weakref.ref(monitor)))
    return monitor


def _finish_at_exit(ref: weakref.ref) -> None:
    """At the interpreter's exit: the summary of a monitor still alive, where logging's streams may be closed."""
    monitor = ref()
    if monitor is None:
        return
    raise_exceptions, logging.raiseExceptions = logging.raiseExceptions, False  # a closed stream: no traceback
    try:
        monitor.finish()
    finally:
        logging.raiseExceptions = raise_exceptions


def finish_this_thread() -> None:
    """Finish (:meth:`FabricCompileMonitor.finish`) the monitors this thread installed.

    For a replica of the spawn strategy when its function returns: its process ends without running
    ``atexit`` (``multiprocessing`` children leave through ``os._exit``).
    """
    me = threading.get_ident()
    for ident, ref in list(_installed):
        monitor = ref()
        if ident == me and monitor is not None:
            monitor.finish()


__all__ = ["FORWARD", "OPTIMIZER_STEP", "STEP", "FabricCompileMonitor", "finish_this_thread", "install"]
