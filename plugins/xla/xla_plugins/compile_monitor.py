"""The compile monitor: compilations and host reads on XLA, per phase of Lightning's loop.

On XLA every step is traced into a graph that torch_xla compiles the first time it sees it. A
graph that keeps changing (new batch shapes, a Python branch on a changing value) is compiled again
and again, and each host read inside a step (``.item()``, ``print(tensor)``, ``if tensor:``) cuts
the step's graph and waits for the device. Neither shows up anywhere unless someone reads
torch_xla's metrics. :func:`install` (called by the XLA accelerator at the start of every
``fit``/``validate``/``test``/``predict``) counts both, per phase, from torch_xla's own metrics
(counter ``UncachedCompile``, metrics ``CompileTime`` and ``TransferFromDeviceTime``), and after a
warm-up reports every new compilation and every host read inside a step, once per distinct cause.

**Phases.** Lightning wraps every hook it calls (``training_step``, ``backward``,
``optimizer_step``, each callback's and the module's hooks, loading the next batch) in
``trainer.profiler.profile("<action>")``. For the run, the trainer's profiler is wrapped in
:class:`PhaseProfiler`, which passes every call on to the user's profiler and, at each action's start
and stop, reads torch_xla's ``UncachedCompile`` counter (one C++ call, about 0.2 us). Compilations
since the last boundary belong to the innermost running action, so each is counted exactly once;
Lightning's own loop work between hooks (logging, progress) is counted under the enclosing loop
action. The profiler route needs no patching of Lightning's functions and sees the callback class
of each hook; a plain ``Callback`` sees only its own hooks (the monitor is one too, for each batch's
shapes). Host reads are counted by the read methods' wrapper (below), in the phase that runs them;
the ``TransferFromDeviceTime`` metric, which copies its list of up to 1024 samples at each read
(about 40 us), is read only when the run starts and ends, for the total: the difference is the
batched reads of Lightning and the plugin (``xm._maybe_convert_to_cpu``: logged metrics, progress
bar, checkpoints), which go through no tensor method.

**Warm-up.** The first :data:`WARMUP_CALLS` calls of each phase are its warm-up (the first and
the second step compile the graphs with fresh and then with existing optimizer state; the sanity
check's validation batches warm the validation step). After them, a compilation in that phase, or a
host read from the user's code inside a step, is *late*. A compilation with input shapes that a
loop sees after other shapes (a second sequence length, a last partial batch) is late even within
the warm-up: phases that run once per loop (``on_validation_end``, where the evaluation's pending
graph runs) would otherwise never leave it.

**The user's line.** For host reads, the ``torch.Tensor`` methods that read an XLA tensor to the
host (:data:`READ_METHODS`) are wrapped while a run is monitored; the wrapper costs one device
check per call of those methods (never on other tensor operations) and, for a late read inside a
step, walks the Python stack to the first frame outside torch, torch_xla and the standard
library. A read from Lightning's or this plugin's own code is counted, not reported. For a
compilation without a read (torch_xla compiles when the step's graph is run, inside Lightning's
optimizer step), the line is where the hook that built the graph is defined, and the cause comes
from the batch: new input shapes (compared with the shapes each loop saw before), otherwise a graph
that differs from the previous one for the same shapes.

**Budget.** ``XLA_PLUGINS_RECOMPILES`` (or a strategy's ``recompiles=`` argument, which wins):
``warn`` (default) warns once per cause with :class:`LateCompilationWarning`; ``error`` raises
:class:`LateCompilationError` at the first late event, with the report; ``off`` installs nothing.

**Summary.** When the run ends (the ``teardown`` hook), ``rank_zero_info`` lines give compilations
and compile seconds per phase, the late compilations and the host reads per step;
:attr:`CompileMonitor.summary` holds the same numbers.
"""

from __future__ import annotations

import inspect
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from lightning.fabric.utilities.rank_zero import rank_zero_info
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.profilers import PassThroughProfiler, Profiler
from lightning_utilities import apply_to_collection
from torch import Tensor

from xla_plugins import _torch_xla_contract

#: Variable that sets the budget: ``warn`` (default), ``error`` or ``off``.
BUDGET_VARIABLE = "XLA_PLUGINS_RECOMPILES"
BUDGETS = ("warn", "error", "off")
#: Calls of each phase that count as its warm-up; events in later calls are late.
WARMUP_CALLS = 2
#: ``torch.Tensor`` methods that copy an XLA tensor's value to the host, wrapped while a run is monitored.
READ_METHODS = (
    "item",
    "tolist",
    "numpy",
    "cpu",
    "__bool__",
    "__float__",
    "__int__",
    "__index__",
    "__repr__",
    "__format__",
)

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
    }
)
#: Modules whose frames are the mechanism of a read, skipped when looking for the line that asked for it.
_SKIPPED = ("torch", "torch_xla", "xla_plugins.compile_monitor", "importlib", "contextlib", "functools", "typing")
#: Modules whose frames mean Lightning or this plugin asked for the read, not the user.
_OWN = ("lightning", "pytorch_lightning", "lightning_fabric", "lightning_utilities", "xla_plugins", "trainer_plugins")

#: Lightning's profiler action names for the monitor's own callback hooks, which are not phases.
_OWN_HOOKS = "[Callback]CompileMonitor."

#: The step hook of each loop, by the loop names of :meth:`CompileMonitor._on_batch`.
_STEP_OF_LOOP = {
    "train": "training_step",
    "validation": "validation_step",
    "test": "test_step",
    "predict": "predict_step",
}

_REMEDIES = {
    "shapes": "pad every batch to a fixed length or to a few bucketed lengths (a collate_fn with a fixed"
    " max_length, or lengths rounded up to a multiple of 64), and use drop_last=True for a last partial batch",
    "read": "keep the value on the device (torch.where instead of `if`, accumulate in a tensor), log it with"
    " self.log(name, tensor) instead of .item() or print, and read it outside the step if at all",
    "graph": "keep Python values that change (the step number, a schedule) out of the traced operations:"
    " pass them as tensors, or make the branch a tensor operation (torch.where)",
}


class LateCompilationWarning(UserWarning):
    """A compilation or host read after the warm-up (``XLA_PLUGINS_RECOMPILES=warn``)."""


class LateCompilationError(RuntimeError):
    """A compilation or host read after the warm-up with ``XLA_PLUGINS_RECOMPILES=error``; the message is the report."""


def check_budget(value: Optional[str], source: str = "recompiles") -> Optional[str]:
    """``value`` as a budget name (``"warn"``, ``"error"``, ``"off"``; case and blanks ignored), ``None`` if ``None``.

    Args:
        value: the budget, or ``None`` (not set).
        source: how the value was given, for the error (``"recompiles"``, the variable's name).

    Raises:
        ValueError: any other value; the message names it and the choices.
    """
    if value is None:
        return None
    budget = str(value).strip().lower()
    if budget not in BUDGETS:
        raise ValueError(f"{source}={value!r} is not a compile budget; choose one of {', '.join(BUDGETS)}.")
    return budget


def budget(strategy_value: Optional[str] = None) -> str:
    """The budget: the strategy's ``recompiles=`` if given, else ``XLA_PLUGINS_RECOMPILES``, else ``"warn"``.

    Raises:
        ValueError: either value is not one of :data:`BUDGETS` (the message names it and the choices).
    """
    from_strategy = check_budget(strategy_value)
    text = os.environ.get(BUDGET_VARIABLE, "")
    from_environment = check_budget(text, BUDGET_VARIABLE) if text.strip() else None
    return from_strategy or from_environment or "warn"


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
        return self.action.rpartition(".")[2] if self.action.startswith("[") else self.action

    @property
    def label(self) -> str:
        """The hook and who runs it: ``on_train_batch_end of callback Printer``, ``training_step``."""
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


class CompileMonitor(Callback):
    """Counts compilations and host reads per phase; reports late ones; prints a summary at the run's end.

    Installed by :func:`install`; reachable as a callback of the trainer (``trainer.callbacks``).

    Args:
        budget: ``"warn"`` or ``"error"`` (see the module docstring).
        warmup_calls: calls of each phase that count as its warm-up (default :data:`WARMUP_CALLS`).
    """

    def __init__(self, budget: str = "warn", warmup_calls: int = WARMUP_CALLS) -> None:
        self.budget = budget
        self.warmup_calls = warmup_calls
        self.summary: dict[str, Any] = {}
        self._start_run(None)

    def _start_run(self, trainer: Any) -> None:
        self._trainer = trainer
        self.phases: dict[str, Phase] = {}
        self.reports: list[str] = []
        self._stack: list[Phase] = []
        self._outside = Phase("outside any hook")
        if trainer is not None:
            self._counter_value, self._metric_data = _torch_xla_contract.metric_readers()
        #: torch_xla's totals when the run started: (compilations, compile seconds, transfers)
        self._first = read_counters() if trainer is not None else (0, 0.0, 0)
        #: compilations and compile seconds counted so far (the transfers are read at the run's end only)
        self._compilations, self._compile_s = self._first[0], self._first[1]
        self._causes: dict[tuple[str, ...], Counts] = {}
        self._shapes_seen: dict[str, set[tuple]] = {}
        #: (loop, input shapes) first seen since the last compilation; the shapes are a tuple of tensor shapes
        self._new_shapes: list[tuple[str, tuple]] = []
        #: whether one of them is not the first shape its loop saw (a second shape: never warm-up)
        self._other_shapes = False
        self._reading = False

    # -- boundaries -------------------------------------------------------------------------------

    def enter(self, action: str) -> None:
        """A profiler action starts: count what happened so far, then make ``action`` the current phase.

        The monitor's own callback hooks are not phases. Everything is inline (one Python call per
        boundary): the common case, no compilation since the last boundary, reads one C++ counter.
        """
        if action.startswith(_OWN_HOOKS):
            return
        if (self._counter_value("UncachedCompile") or 0) != self._compilations:
            self._flush()
        phase = self.phases.get(action)
        if phase is None:
            phase = self.phases[action] = Phase(action)
        phase.calls += 1
        self._stack.append(phase)

    def leave(self, action: str) -> None:
        """A profiler action stops: count what happened in it, then return to the enclosing phase."""
        if action.startswith(_OWN_HOOKS):
            return
        if (self._counter_value("UncachedCompile") or 0) != self._compilations:
            self._flush()
        if self._stack and self._stack[-1].action == action:
            self._stack.pop()

    def _current(self) -> Phase:
        return self._stack[-1] if self._stack else self._outside

    def _flush(self, read: Optional[tuple[str, Any]] = None) -> None:
        """Give the compilations since the last boundary, and the host read ``read`` if any, to the current phase.

        ``read`` is ``(method, frame)`` after one wrapped read of an XLA tensor. Reports a late event.
        The compile seconds (torch_xla's ``CompileTime``, whose sample list makes it dear to read:
        about 40 us with a full buffer) are read only when the compilation count changed.
        """
        compilations = self._counter_value("UncachedCompile") or 0
        delta = Counts(compilations - self._compilations, 0.0, 1 if read is not None else 0)
        if not delta:
            return
        if delta.compilations:
            compile_time = self._metric_data("CompileTime")
            compile_s = compile_time[1] / 1e9 if compile_time else 0.0
            delta.compile_s = compile_s - self._compile_s
            self._compilations, self._compile_s = compilations, compile_s
        phase = self._current()
        phase.counts.add(delta)
        new_shapes, other_shapes = self._new_shapes, self._other_shapes
        if delta.compilations:
            self._new_shapes, self._other_shapes = [], False
        if phase.calls <= self.warmup_calls and not (delta.compilations and other_shapes):
            return
        if read is not None and phase.in_step:
            line = _user_line(read[1])
            if line is not None:
                self._report(
                    phase,
                    ("read", read[0], line),
                    delta,
                    f"a host read (`.{read[0]}()`)" if not read[0].startswith("__") else _dunder_why(read[0]),
                    line,
                )
                return
        if delta.compilations:
            phase.late_compilations += delta.compilations
            step_hook = "training_step" if phase.hook in ("backward", "optimizer_step") else None
            if new_shapes:
                step_hook = _STEP_OF_LOOP[new_shapes[0][0]]
                shown = "; ".join(_shapes_text(shapes) for _, shapes in new_shapes)
                kind, why = "shapes", f"new input shapes ({shown}) not seen before in this loop"
            else:
                kind, why = "graph", "a graph that differs from the previous one, with input shapes seen before"
            where = phase.label
            if step_hook is not None and step_hook != phase.hook:
                where = f"{step_hook} (its graph ran at {phase.label})"
            self._report(phase, (kind,), delta, why, self._hook_line(phase, step_hook), where)

    def _report(
        self, phase: Phase, cause: tuple, delta: Counts, why: str, line: Optional[str], where: Optional[str] = None
    ) -> None:
        key = (phase.action, *cause)
        total = self._causes.get(key)
        if total is not None:
            total.add(delta)
            return
        self._causes[key] = total = Counts()
        total.add(delta)
        kind = "host read" if cause[0] == "read" else "late compilation"
        when = (
            f"call {phase.calls}, after the warm-up of {self.warmup_calls}"
            if phase.calls > self.warmup_calls
            else "input shapes that follow other shapes in the same loop"
        )
        text = (
            f"XLA compile monitor: {kind} in {where or phase.label} ({when}).\n"
            f"  line:   {line or 'not found in your code (Lightning or a library asked)'}\n"
            f"  why:    {why}\n"
            f"  cost:   {total.compilations} compilation(s), {total.compile_s:.2f} s compiling so far for this cause;"
            f" {total.host_reads} device-to-host transfer(s)\n"
            f"  remedy: {_REMEDIES[cause[0]]}\n"
            f"  Reported once per cause; {BUDGET_VARIABLE}=error makes it an error, =off silences it."
        )
        self.reports.append(text)
        if self.budget == "error":
            raise LateCompilationError(text)
        warnings.warn(text, LateCompilationWarning, stacklevel=2)

    def _hook_line(self, phase: Phase, step_hook: Optional[str] = None) -> Optional[str]:
        """``file:line`` where the hook that built the phase's graph starts: ``step_hook`` of the module if given."""
        trainer = self._trainer
        if trainer is None:
            return None
        hook, owner = phase.hook, trainer.lightning_module
        if step_hook is not None:
            hook = step_hook
        elif phase.action.startswith("[Callback]"):
            key = phase.action[len("[Callback]") :].rpartition(".")[0]
            owner = next((c for c in trainer.callbacks if c.state_key == key), None)
        elif hook in ("backward", "optimizer_step", "optimizer_zero_grad", "run_training_batch") or "_next" in hook:
            hook = "training_step"
        elif not hasattr(owner, hook):
            hook = f"{trainer.state.stage.value}_step" if trainer.state.stage is not None else hook
        function = getattr(type(owner), hook, None) if owner is not None else None
        try:
            code = inspect.unwrap(function).__code__  # type: ignore[arg-type]
        except (AttributeError, TypeError, ValueError):
            return None
        return f"{code.co_filename}:{code.co_firstlineno} ({type(owner).__name__}.{hook})"

    # -- reads ------------------------------------------------------------------------------------

    def read(self, method: str, original: Callable[..., Any], tensor: Tensor, args: Any, kwargs: Any) -> Any:
        """Run ``tensor.<method>(...)`` (an XLA tensor), counting its transfers apart, with the caller's frame."""
        self._flush()
        self._reading = True
        try:
            return original(tensor, *args, **kwargs)
        finally:
            self._reading = False
            self._flush(read=(method, sys._getframe(2)))

    # -- batches (Lightning's callback hooks) -----------------------------------------------------

    def _on_batch(self, loop: str, batch: Any) -> None:
        shapes: list[tuple] = []
        apply_to_collection(batch, Tensor, lambda t: shapes.append(tuple(t.shape)))
        signature = tuple(shapes)
        seen = self._shapes_seen.setdefault(loop, set())
        if signature not in seen:
            self._other_shapes = self._other_shapes or bool(seen)
            seen.add(signature)
            self._new_shapes.append((loop, signature))

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._on_batch("train", batch)

    def on_validation_batch_start(self, trainer: Any, pl_module: Any, batch: Any, *args: Any) -> None:
        self._on_batch("validation", batch)

    def on_test_batch_start(self, trainer: Any, pl_module: Any, batch: Any, *args: Any) -> None:
        self._on_batch("test", batch)

    def on_predict_batch_start(self, trainer: Any, pl_module: Any, batch: Any, *args: Any) -> None:
        self._on_batch("predict", batch)

    # -- the end of the run -----------------------------------------------------------------------

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Count the rest, print the summary, give the trainer its own profiler back, unwrap the reads."""
        self._flush()
        _unwrap_reads()
        if isinstance(trainer.profiler, PhaseProfiler):
            trainer.profiler = trainer.profiler.inner
        self.summary = self._summarize(str(getattr(stage, "value", stage)))
        for line in _summary_lines(self.summary):
            rank_zero_info(line)
        self._trainer = None

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Unwrap the reads and give the trainer its own profiler back (a run that raised has no teardown)."""
        _unwrap_reads()
        if isinstance(trainer.profiler, PhaseProfiler):
            trainer.profiler = trainer.profiler.inner

    def _summarize(self, stage: str) -> dict[str, Any]:
        phases = [p for p in (*self.phases.values(), self._outside) if p.counts]
        steps = sum(
            p.calls
            for p in self.phases.values()
            if p.hook in ("training_step", "validation_step", "test_step", "predict_step")
        )
        step_reads = sum(p.counts.host_reads for p in phases if p.in_step)
        tensor_reads = sum(p.counts.host_reads for p in phases)
        last = read_counters()
        return {
            "stage": stage,
            "compilations": last[0] - self._first[0],
            "compile_s": last[1] - self._first[1],
            "host_reads": last[2] - self._first[2],
            "host_reads_not_through_tensor_methods": last[2] - self._first[2] - tensor_reads,
            "late_compilations": sum(p.late_compilations for p in phases),
            "reports": len(self.reports),
            "steps": steps,
            "host_reads_in_steps": step_reads,
            "phases": {
                p.label: {
                    "calls": p.calls,
                    "compilations": p.counts.compilations,
                    "compile_s": p.counts.compile_s,
                    "host_reads": p.counts.host_reads,
                    "late_compilations": p.late_compilations,
                }
                for p in phases
            },
        }


def _summary_lines(summary: dict[str, Any]) -> list[str]:
    steps = summary["steps"]
    per_step = summary["host_reads_in_steps"] / steps if steps else 0.0
    lines = [
        f"XLA compile monitor ({summary['stage']}): {summary['compilations']} compilation(s),"
        f" {summary['compile_s']:.2f} s compiling, {summary['late_compilations']} late;"
        f" {summary['host_reads']} host read(s), {per_step:.2f} per step inside steps ({steps} steps);"
        f" {summary['reports']} cause(s) reported."
    ]
    for label, counts in summary["phases"].items():
        lines.append(
            f"  {label}: {counts['compilations']} compilation(s), {counts['compile_s']:.2f} s,"
            f" {counts['late_compilations']} late, {counts['host_reads']} host read(s) in {counts['calls']} call(s)"
        )
    lines.append(
        f"  batched reads of Lightning and the plugin (logged metrics, progress bar, checkpoints; not per phase):"
        f" {summary['host_reads_not_through_tensor_methods']} host read(s)"
    )
    return lines


class PhaseProfiler(Profiler):
    """The trainer's profiler, wrapped: every call goes on to ``inner``; action boundaries go to ``monitor``.

    Args:
        inner: the profiler the trainer had (Lightning's ``PassThroughProfiler`` by default).
        monitor: the :class:`CompileMonitor` of the run.
    """

    def __init__(self, inner: Profiler, monitor: CompileMonitor) -> None:
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


#: method name -> torch's own method, while reads are wrapped
_ORIGINALS: dict[str, Callable[..., Any]] = {}
_ACTIVE: list[CompileMonitor] = []


def _wrap_reads(monitor: CompileMonitor) -> None:
    """Route :data:`READ_METHODS` of XLA tensors through ``monitor.read`` (idempotent)."""
    _ACTIVE[:] = [monitor]
    for name in READ_METHODS:
        if name in _ORIGINALS:
            continue
        original = getattr(torch.Tensor, name)
        _ORIGINALS[name] = original
        wrapper = _read_wrapper(name, original)
        setattr(torch.Tensor, name, wrapper)


def _read_wrapper(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (a ``torch.Tensor`` method) going through the active monitor for XLA tensors."""

    def wrapper(self: Tensor, *args: Any, **kwargs: Any) -> Any:
        if not _ACTIVE or _ACTIVE[0]._reading or self.device.type != "xla":
            return original(self, *args, **kwargs)
        return _ACTIVE[0].read(name, original, self, args, kwargs)

    wrapper.__name__, wrapper.__qualname__, wrapper.__doc__ = name, f"Tensor.{name}", original.__doc__
    return wrapper


def _unwrap_reads() -> None:
    """Give ``torch.Tensor`` its own read methods back."""
    _ACTIVE.clear()
    for name, original in _ORIGINALS.items():
        setattr(torch.Tensor, name, original)
    _ORIGINALS.clear()


def _module_of(frame: Any) -> str:
    return frame.f_globals.get("__name__", "") or ""


def _matches(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _user_line(frame: Any) -> Optional[str]:
    """``file:line  code`` of the first frame from ``frame`` outward that is the user's; ``None`` if Lightning's own."""
    while frame is not None:
        module = _module_of(frame)
        top = module.partition(".")[0]
        if _matches(module, _SKIPPED) or top in sys.stdlib_module_names:
            frame = frame.f_back
            continue
        if _matches(module, _OWN):
            return None
        info = inspect.getframeinfo(frame, context=1)
        code = info.code_context[0].strip() if info.code_context else ""
        return f"{info.filename}:{info.lineno}  `{code}`"
    return None


def _dunder_why(method: str) -> str:
    what = {
        "__bool__": "`if tensor:` or bool(tensor)",
        "__repr__": "printing or formatting a tensor",
        "__format__": "formatting a tensor (f-string)",
    }
    return f"a host read ({what.get(method, f'{method.strip(chr(95))}(tensor)')})"


def _shapes_text(shapes: tuple) -> str:
    return ", ".join("x".join(map(str, shape)) or "scalar" for shape in shapes) or "(no tensors)"


def install(trainer: Any) -> Optional[CompileMonitor]:
    """Monitor ``trainer``'s run (see the module docstring) unless the budget is ``off``.

    Idempotent within a run; a monitor left from an earlier run of the same trainer is reused.

    Args:
        trainer: a ``lightning.pytorch.Trainer`` whose strategy may have a ``recompiles`` attribute.

    Returns:
        The monitor, or ``None`` when the budget is ``off``.

    Raises:
        ValueError: ``XLA_PLUGINS_RECOMPILES`` or the strategy's ``recompiles`` is not one of :data:`BUDGETS`.
    """
    chosen = budget(getattr(trainer.strategy, "recompiles", None))
    if isinstance(trainer.profiler, PhaseProfiler):  # left by a run that raised
        trainer.profiler = trainer.profiler.inner
    monitor = next((c for c in trainer.callbacks if isinstance(c, CompileMonitor)), None)
    if chosen == "off":
        _unwrap_reads()
        if monitor is not None:  # left by an earlier run of this trainer: it must not report on this one
            trainer.callbacks.remove(monitor)
        return None
    if monitor is None:
        monitor = CompileMonitor(chosen)
        trainer.callbacks.append(monitor)
    monitor.budget = chosen
    monitor._start_run(trainer)
    trainer.profiler = PhaseProfiler(trainer.profiler, monitor)
    _wrap_reads(monitor)
    return monitor


__all__ = [
    "BUDGETS",
    "BUDGET_VARIABLE",
    "READ_METHODS",
    "WARMUP_CALLS",
    "CompileMonitor",
    "LateCompilationError",
    "LateCompilationWarning",
    "PhaseProfiler",
    "budget",
    "check_budget",
    "install",
    "read_counters",
]
