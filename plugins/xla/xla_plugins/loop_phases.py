"""The phases of Lightning's loop, with torch_xla's counts of each: the compile monitor's bookkeeping.

Lightning wraps every hook it calls (``training_step``, ``backward``, ``optimizer_step``, each
callback's and the module's hooks, loading the next batch) in ``trainer.profiler.profile("<action>")``.
For a monitored run, the trainer's profiler is wrapped in :class:`PhaseProfiler`, which passes every
call on to the user's profiler and hands each action's start and stop to the compile monitor
(:mod:`xla_plugins.compile_monitor`). Each action is a :class:`Phase`, with its calls and its
:class:`Counts` (from torch_xla's counter ``UncachedCompile`` and metrics ``CompileTime`` and
``TransferFromDeviceTime``, :func:`read_counters`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from lightning.pytorch.profilers import PassThroughProfiler, Profiler

#: Hooks that run inside a step: a host read from the user's code in one of them is reported.
_STEP_HOOKS = frozenset(
    {
        "training_step",
        "validation_step",
        "test_step",
        "predict_step",
        "backward",
        "optimizer_step",
        "optimizer_zero_grad",
        "on_before_backward",
        "on_after_backward",
        "on_before_optimizer_step",
        "on_before_zero_grad",
        "configure_gradient_clipping",
        "run_training_batch",
        "step",  # a training step of a Fabric loop (xla_plugins.fabric_steps)
        "forward",
    }
)

#: Prefix of the phases of a Fabric loop (:mod:`xla_plugins.fabric_steps`), which has no profiler actions.
FABRIC = "[Fabric]"
#: How the report names each phase of a Fabric loop, by hook.
_FABRIC_LABELS = {
    "step": "the training step",
    "forward": "the module's forward",
    "optimizer_step": "optimizer.step",
}


@dataclass
class Counts:
    """Counts of one phase or cause: compilations, compile seconds and device-to-host transfers.

    From torch_xla's counter ``UncachedCompile`` and metrics ``CompileTime`` and ``TransferFromDeviceTime``.
    """

    compilations: int = 0
    compile_s: float = 0.0
    host_reads: int = 0

    def add(self, other: Counts) -> None:
        self.compilations += other.compilations
        self.compile_s += other.compile_s
        self.host_reads += other.host_reads

    def __bool__(self) -> bool:
        return bool(self.compilations or self.host_reads)


def read_counters() -> tuple[int, float, int]:
    """torch_xla's totals so far: (``UncachedCompile`` count, ``CompileTime`` in s, ``TransferFromDeviceTime`` count).

    Reads ``torch_xla.debug.metrics`` (each read is one C++ call; no device work).
    """
    import torch_xla.debug.metrics as met

    compile_time = met.metric_data("CompileTime")
    transfers = met.metric_data("TransferFromDeviceTime")
    return (
        met.counter_value("UncachedCompile") or 0,
        compile_time[1] / 1e9 if compile_time else 0.0,
        transfers[0] if transfers else 0,
    )


@dataclass
class Phase:
    """One phase of the loop: a profiler action (a hook, possibly of a callback), its calls and counts."""

    action: str
    calls: int = 0
    counts: Counts = field(default_factory=Counts)
    late_compilations: int = 0

    @property
    def hook(self) -> str:
        """The hook's name: ``training_step`` for ``[Strategy]SingleDeviceXLAStrategy.training_step``."""
        if self.action.startswith(FABRIC):
            return self.action[len(FABRIC) :]
        return self.action.rpartition(".")[2] if self.action.startswith("[") else self.action

    @property
    def label(self) -> str:
        """The hook and who runs it: ``on_train_batch_end of callback Printer``, ``training_step``."""
        if self.action.startswith(FABRIC):
            return _FABRIC_LABELS.get(self.hook, self.hook)
        if self.action.startswith("[Callback]"):
            owner = self.action[len("[Callback]") :].rpartition(".")[0].split("{")[0]
            return f"{self.hook} of callback {owner}"
        if self.action.startswith("[LightningModule]") or self.action.startswith("[Strategy]"):
            return self.hook
        if self.action.startswith("["):  # a loop's own action: "[_TrainingEpochLoop].train_dataloader_next"
            return self.action.rpartition(".")[2]
        return f"{self.action} (Lightning's loop: logging, progress)" if self.action.startswith("run_") else self.action

    @property
    def in_step(self) -> bool:
        return self.hook in _STEP_HOOKS or (self.hook.startswith("on_") and "_batch_" in self.hook)


class PhaseBoundaries(Protocol):
    """What :class:`PhaseProfiler` tells of each profiler action: the compile monitor (``CompileMonitor``)."""

    def enter(self, action_name: str) -> None:
        """The profiler action ``action_name`` starts."""

    def leave(self, action_name: str) -> None:
        """The profiler action ``action_name`` stops."""


class PhaseProfiler(Profiler):
    """The trainer's profiler, wrapped: every call goes on to ``inner``; action boundaries go to ``monitor``.

    Args:
        inner: the profiler the trainer had (Lightning's ``PassThroughProfiler`` by default).
        monitor: the compile monitor of the run (:class:`~xla_plugins.compile_monitor.CompileMonitor`).
    """

    def __init__(self, inner: Profiler, monitor: PhaseBoundaries) -> None:
        super().__init__()
        self.inner, self.monitor = inner, monitor
        if type(inner) is PassThroughProfiler:
            # Lightning's default profiler does nothing at start and stop: go to the monitor directly
            self.start, self.stop = monitor.enter, monitor.leave  # type: ignore[method-assign]

    def start(self, action_name: str) -> None:
        self.monitor.enter(action_name)
        self.inner.start(action_name)

    def stop(self, action_name: str) -> None:
        self.inner.stop(action_name)
        self.monitor.leave(action_name)

    def summary(self) -> str:
        return self.inner.summary()

    def setup(self, *args: Any, **kwargs: Any) -> None:
        self.inner.setup(*args, **kwargs)

    def teardown(self, *args: Any, **kwargs: Any) -> None:
        self.inner.teardown(*args, **kwargs)

    def describe(self) -> None:
        self.inner.describe()

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "monitor"):
            raise AttributeError(name)
        return getattr(self.inner, name)


__all__ = ["FABRIC", "Counts", "Phase", "PhaseBoundaries", "PhaseProfiler", "read_counters"]
