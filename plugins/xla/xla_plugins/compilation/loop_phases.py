"""The phases of Lightning's loop, with torch_xla's counts of each: the compile monitor's bookkeeping.

Lightning wraps every hook it calls (``training_step``, ``backward``, ``optimizer_step``, each
callback's and the module's hooks, loading the next batch) in ``trainer.profiler.profile("<action>")``.
For a monitored run, the compile monitor (:mod:`xla_plugins.compilation.compile_monitor`) hears each action's
start and stop as a listener of the core's ``ActionProfiler`` (``trainer_plugins.add_action_listener``),
which passes every call on to the user's profiler. Each action is a :class:`Phase`, with its calls and its
:class:`Counts` (from torch_xla's counter ``UncachedCompile`` and metrics ``CompileTime`` and
``TransferFromDeviceTime``, :func:`read_counters`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from xla_plugins.runtime import _torch_xla_contract

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
        "step",  # a training step of a Fabric loop (xla_plugins.compilation.fabric_steps)
        "forward",
    }
)

#: Prefix of the phases of a Fabric loop (:mod:`xla_plugins.compilation.fabric_steps`), which has no profiler actions.
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


class CompileSeconds:
    """torch_xla's compile seconds so far in this process (the ``CompileTime`` metric's total, in s), as a callable.

    The goodput ledger's compile-seconds reader. ``CompileTime`` copies its list of up to 1024
    samples at each read (about 40 us with a full buffer), so it is read only when torch_xla's
    ``UncachedCompile`` counter (one C++ call, about 0.2 us) has moved since the last call, as the
    compile monitor does.
    """

    def __init__(self) -> None:
        self._counter_value, self._metric_data = _torch_xla_contract.metric_readers()
        self._compilations: Optional[int] = None
        self._seconds = 0.0

    def __call__(self) -> float:
        compilations = self._counter_value("UncachedCompile") or 0
        if compilations != self._compilations:
            compile_time = self._metric_data("CompileTime")
            self._seconds = compile_time[1] / 1e9 if compile_time else 0.0
            self._compilations = compilations
        return self._seconds


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


__all__ = ["FABRIC", "CompileSeconds", "Counts", "Phase", "read_counters"]
