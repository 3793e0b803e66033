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
``trainer.profiler.profile("<action>")``. For the run, the monitor listens to those actions
(``trainer_plugins.add_action_listener``: the core's one wrapper of the trainer's profiler, which
passes every call on to the user's profiler) and, at each action's start and stop, reads
torch_xla's ``UncachedCompile`` counter (one C++ call, about 0.2 us). The actions that run only
empty hooks (a callback's hooks that its class does not override, the module's default hooks:
``trainer_plugins.runs_empty_hook``), about half of a default Trainer's, are not heard: nothing
compiles or reads in them. Compilations
since the last boundary belong to the innermost running action, so each is counted exactly once;
Lightning's own loop work between hooks (logging, progress) is counted under the enclosing loop
action. The profiler route needs no patching of Lightning's functions and sees the callback class
of each hook; a plain ``Callback`` sees only its own hooks (the monitor is one too, for each batch's
shapes). Host reads are counted by the read methods' wrapper, in the phase that runs them;
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

**Where the parts live.** The phases and their counts: :mod:`xla_plugins.compilation.loop_phases`; the
wrapped read methods and the user's line of a read: :mod:`xla_plugins.compilation.host_reads`; the line and
cause of a late compilation, the report's and the summary's text: :mod:`xla_plugins.compilation.compile_reports`;
the budget (``XLA_PLUGINS_RECOMPILES``: ``warn``/``error``/``off``): :mod:`xla_plugins.compilation.recompile_budget`.

**Replica threads.** Where one process drives several devices with one replica thread each (the
spawn strategy ``xla`` on PJRT CPU, and on TPU v2/v3, whose processes drive two cores), each
replica has its own monitor, but torch_xla's counters are the process's: a monitor also sees the
compilations of the other replicas, which compile the same graphs for their own devices, a phase
earlier or later. So there a late compilation is reported only where its cause is the replica's
own (new input shapes of its own batches); host reads are counted by the thread that reads, and
reported as everywhere (see :func:`replica_threads`).

**Summary.** When the run ends (the ``teardown`` hook), global rank 0 logs one line: what the run
did in Lightning's counts, its compilations and how many were late (with the goodput of a ``fit``;
:mod:`xla_plugins.end_of_run`); the table of compilations, compile seconds and host reads per phase
when a cause was reported or on request (``XLA_PLUGINS_SUMMARY=tables``). :attr:`CompileMonitor.summary`
holds the same numbers on every rank.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

from lightning.pytorch.callbacks import Callback
from lightning_utilities import apply_to_collection
from torch import Tensor

from trainer_plugins import add_action_listener, remove_action_listener, runs_empty_hook
from xla_plugins import end_of_run
from xla_plugins.compilation import compile_cache
from xla_plugins.compilation.compile_reports import hook_line, report_text, run_summary, shapes_text, summary_lines
from xla_plugins.compilation.host_reads import (
    READ_METHODS,
    SourceLine,
    read_cause,
    unwrap_reads,
    user_line,
    warn_at,
    wrap_reads,
)
from xla_plugins.compilation.loop_phases import Counts, Phase, read_counters
from xla_plugins.compilation.recompile_budget import (
    BUDGET_VARIABLE,
    BUDGETS,
    LateCompilationError,
    LateCompilationWarning,
    budget,
    check_budget,
)
from xla_plugins.runtime import _probes, _torch_xla_contract

#: Calls of each phase that count as its warm-up; events in later calls are late.
WARMUP_CALLS = 2

#: Lightning's profiler action names for the monitor's own callback hooks, which are not phases.
_OWN_HOOKS = "[Callback]CompileMonitor."

#: The step hook of each loop, by the loop names of :meth:`CompileMonitor._on_batch`.
_STEP_OF_LOOP = {
    "train": "training_step",
    "validation": "validation_step",
    "test": "test_step",
    "predict": "predict_step",
}


#: The evaluation loops, by the loop names of :meth:`CompileMonitor._on_batch`, with the trainer's count of
#: their batches per dataloader (Lightning's ``Trainer.num_val_batches`` etc.).
_BATCH_COUNTS = {
    "validation": "num_val_batches",
    "test": "num_test_batches",
    "predict": "num_predict_batches",
}


@dataclass
class NewShapes:
    """A batch's input shapes that its loop had not seen before in this run.

    Attributes:
        loop: the loop (``"train"``, ``"validation"``, ..., Fabric's ``"training"``, ``"evaluation"``).
        shapes: the batch's tensor shapes, a tuple of tuples.
        after_other: the loop saw other shapes before (so even a compilation in the warm-up is late).
        expected: the last batch of an evaluation loader (smaller when the loader's length is not a
            multiple of its batch size): one compilation that is expected, never reported.
        explained: a compilation has already been explained by these shapes.
    """

    loop: str
    shapes: tuple
    after_other: bool
    expected: bool = False
    explained: bool = False


def replica_threads(world_size: int) -> int:
    """How many replicas of a run of ``world_size`` ranks share this process, and so torch_xla's counters.

    The ranks a process holds: ``world_size`` over torch_xla's ``process_count``. 1 for
    ``single_xla`` and the SPMD strategies (one rank a process), and for the spawn strategy where
    each process drives one device (TPU v4 and later); the devices of a process where it drives
    several, one replica thread each (PJRT CPU, TPU v2/v3).

    Args:
        world_size: the run's ranks (the strategy's ``world_size``).

    Raises:
        RuntimeError: the PJRT runtime cannot be read (see :func:`~xla_plugins.runtime._probes.runtime_figures`).
    """
    if world_size <= 1:
        return 1
    return max(1, world_size // _probes.runtime_figures().process_count)


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
        """Start counting a run of ``trainer`` (a Trainer, or the Fabric strategy; ``None``: not yet)."""
        self._trainer = trainer
        #: the replicas whose compilations torch_xla's counters of this process add up (:func:`replica_threads`)
        self.replica_threads = 1 if trainer is None else replica_threads(trainer.world_size)
        # read now, inside the launched run: Lightning's XLA strategies report rank 0 again after their teardown
        self._global_zero = True if trainer is None else bool(trainer.is_global_zero)
        self.phases: dict[str, Phase] = {}
        self.reports: list[str] = []
        #: the causes warned about in any run of this monitor's trainer: each is warned once per trainer
        self._warned: set[tuple] = getattr(self, "_warned", set())
        self._stack: list[Phase] = []
        self._outside = Phase(self._outside_label)
        if trainer is not None:
            self._counter_value, self._metric_data = _torch_xla_contract.metric_readers()
        #: torch_xla's totals when the run started: (compilations, compile seconds, transfers)
        self._first = read_counters() if trainer is not None else (0, 0.0, 0)
        #: compilations and compile seconds counted so far (the transfers are read at the run's end only)
        self._compilations, self._compile_s = self._first[0], self._first[1]
        self._causes: dict[tuple[str, ...], Counts] = {}
        self._shapes_seen: dict[str, set[tuple]] = {}
        #: the new input shapes of the current batch, and of earlier batches whose graphs have not compiled yet:
        #: they explain the compilations until the next batch starts (:meth:`_batch_starts`)
        self._new_shapes: list[NewShapes] = []
        self._reading = False

    # -- boundaries -------------------------------------------------------------------------------

    def hears(self, action: str) -> bool:
        """Whether the monitor hears the profiler action ``action`` (asked once per name by the core's wrapper).

        Not its own callback hooks, and not the actions that run only empty hooks
        (``trainer_plugins.runs_empty_hook``: a callback's hooks its class does not override, the
        module's default hooks), in which nothing can compile or read: what happens between two
        boundaries still goes to the innermost action heard, so every count stays where it was, and
        those actions cost no counter read.
        """
        return not action.startswith(_OWN_HOOKS) and not runs_empty_hook(self._trainer, action)

    def enter(self, action: str) -> None:
        """A profiler action starts: count what happened so far, then make ``action`` the current phase.

        Everything is inline (one Python call per boundary): the common case, no compilation since
        the last boundary, reads one C++ counter.
        """
        if (self._counter_value("UncachedCompile") or 0) != self._compilations:
            self._flush()
        phase = self.phases.get(action)
        if phase is None:
            phase = self.phases[action] = Phase(action)
        phase.calls += 1
        self._stack.append(phase)

    def leave(self, action: str) -> None:
        """A profiler action stops: count what happened in it, then return to the enclosing phase."""
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
        new_shapes = self._new_shapes
        warm_up = phase.calls <= self.warmup_calls
        if read is not None and phase.in_step and not warm_up:
            line = user_line(read[1])
            if line is not None:
                if not delta.compilations or not new_shapes:
                    # the compilation, if any, is of the graph the read cut: the read's own cost
                    self._report(phase, ("read", read[0], line), delta, read_cause(read[0]), line)
                    return
                # the batch's new shapes explain the compilation: each cause reported as itself
                self._report(phase, ("read", read[0], line), Counts(0, 0.0, 1), read_cause(read[0]), line)
                delta = Counts(delta.compilations, delta.compile_s, 0)
        if not delta.compilations:
            return
        for entry in new_shapes:
            entry.explained = True
        if new_shapes:
            unexpected = [entry for entry in new_shapes if not entry.expected]
            if not unexpected or (warm_up and not any(entry.after_other for entry in unexpected)):
                return
            self._report_compilation(phase, delta, unexpected)
        elif not warm_up and self.replica_threads == 1:
            # with several replica threads it is perhaps another replica's compilation of its own graph
            self._report_compilation(phase, delta, [])

    def _report_compilation(self, phase: Phase, delta: Counts, new_shapes: list[NewShapes]) -> None:
        """Report ``delta``'s compilations in ``phase``, explained by ``new_shapes`` (none: a different graph).

        A different graph that no code of the user's built (Lightning's own work between or around the
        hooks: a checkpoint's save, the loop's logging) is counted as late in the summary's table and
        not reported: there is nothing in the user's code to change.
        """
        phase.late_compilations += delta.compilations
        step_hook = self._step_of_phase(phase)
        if new_shapes:
            step_hook = self._step_of_loop[new_shapes[0].loop]
        line = self._compilation_line(phase, step_hook)
        if line is None and not new_shapes:
            return
        if new_shapes:
            loop = new_shapes[0].loop
            shown = "; ".join(shapes_text(entry.shapes) for entry in new_shapes)
            why = f"new input shapes ({shown}) not seen before in this loop"
            cause: tuple = ("shapes", loop)
        else:
            why = "a graph that differs from the previous one, with input shapes seen before"
            cause = ("graph", phase.action)
        where = phase.label
        if step_hook is not None and step_hook != phase.hook:
            where = f"{self._step_label(step_hook)} (its graph ran at {phase.label})"
        training = not new_shapes or new_shapes[0].loop in ("train", "training")
        self._report(phase, cause, delta, why, line, where, training)

    # -- what a late compilation names (the Trainer's hooks; compilation.fabric_steps names Fabric's) --------

    #: the step hook of each loop, by the loop names of :meth:`_on_batch`
    _step_of_loop = _STEP_OF_LOOP
    #: the hooks whose calls the summary counts as steps
    _step_hooks = frozenset(_STEP_OF_LOOP.values())
    #: the phase of what runs outside every profiled action
    _outside_label = "between hooks (Lightning's own loop work)"

    def _step_of_phase(self, phase: Phase) -> Optional[str]:
        """The step hook whose graph runs in ``phase``: ``training_step`` for ``backward`` and ``optimizer_step``."""
        return "training_step" if phase.hook in ("backward", "optimizer_step") else None

    def _step_label(self, step_hook: str) -> str:
        return step_hook

    def _compilation_line(self, phase: Phase, step_hook: Optional[str]) -> Optional[SourceLine]:
        """Where the code that built the compiled graph starts: the hook's definition (:func:`hook_line`)."""
        return hook_line(self._trainer, phase, step_hook)

    def _report(
        self,
        phase: Phase,
        cause: tuple,
        delta: Counts,
        why: str,
        line: Optional[SourceLine],
        where: Optional[str] = None,
        training: bool = True,
    ) -> None:
        """Add ``delta`` to the cost of ``cause``; the first time in this run, report it (see the module docstring).

        ``cause`` is ``(kind, ...)``, its kind a key of the remedies (``"read"``, ``"shapes"``, ``"graph"``)
        and the rest what tells causes of that kind apart. The warning is located at ``line`` (the user's)
        and issued once per cause and trainer; with the budget ``error``, the report is raised in every run.
        """
        total = self._causes.get(cause)
        if total is not None:
            total.add(delta)
            return
        self._causes[cause] = total = Counts()
        total.add(delta)
        text = report_text(phase, cause[0], total, why, line, where, self.warmup_calls, training)
        self.reports.append(text)
        if self.budget == "error":
            raise LateCompilationError(text)
        if cause not in self._warned:
            self._warned.add(cause)
            warn_at(text, LateCompilationWarning, line)

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

    def _on_batch(self, loop: str, batch: Any, last: bool = False) -> None:
        """Note ``batch``'s input shapes if ``loop`` has not seen them; ``last``: its evaluation loader's last batch."""
        shapes: list[tuple] = []
        apply_to_collection(batch, Tensor, lambda t: shapes.append(tuple(t.shape)))
        signature = tuple(shapes)
        seen = self._shapes_seen.setdefault(loop, set())
        if signature not in seen:
            self._new_shapes.append(NewShapes(loop, signature, bool(seen), expected=last and bool(seen)))
            seen.add(signature)

    def _batch_starts(self) -> None:
        """A batch starts: the new shapes of earlier batches no longer explain compilations once they explained one.

        Those whose graphs have not compiled yet (an evaluation loop runs the graphs of all its
        batches at its end) still do.
        """
        if self._new_shapes:
            self._new_shapes = [entry for entry in self._new_shapes if not entry.explained]

    def _on_evaluation_batch(self, loop: str, trainer: Any, batch: Any, batch_idx: int, dataloader_idx: int) -> None:
        """``batch`` of an evaluation loop: whether it is the last of its dataloader, from Lightning's own batch count.

        The count is Lightning's (``Trainer.num_val_batches``, ``num_sanity_val_batches`` in the sanity
        check, ``num_test_batches``, ``num_predict_batches``), so ``limit_*_batches`` is respected; a
        loader without a length has no last batch.
        """
        self._batch_starts()
        counts = getattr(trainer, "num_sanity_val_batches" if trainer.sanity_checking else _BATCH_COUNTS[loop], [])
        count = counts[dataloader_idx] if 0 <= dataloader_idx < len(counts) else math.inf
        self._on_batch(loop, batch, last=math.isfinite(count) and batch_idx == int(count) - 1)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._batch_starts()
        self._on_batch("train", batch)

    def on_validation_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._on_evaluation_batch("validation", trainer, batch, batch_idx, dataloader_idx)

    def on_test_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._on_evaluation_batch("test", trainer, batch, batch_idx, dataloader_idx)

    def on_predict_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._on_evaluation_batch("predict", trainer, batch, batch_idx, dataloader_idx)

    # -- the end of the run -----------------------------------------------------------------------

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Count the rest, log the run's end (:mod:`xla_plugins.end_of_run`), stop listening, unwrap the reads."""
        self._flush()
        unwrap_reads()
        remove_action_listener(trainer, self)
        self.summary = self._summarize(str(getattr(stage, "value", stage)))
        self._log_summary(trainer)
        compile_cache.warn_if_unreadable()
        self._trainer = None

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Unwrap the reads and stop listening to the trainer's profiler (a run that raised has no teardown)."""
        unwrap_reads()
        remove_action_listener(trainer, self)
        end_of_run.run_starts(trainer, monitored=False)  # no teardown follows: the goodput ledger logs itself

    def _log_summary(self, trainer: Any) -> None:
        """Log the end of the run if this replica is global rank 0 (its strategy's own rank, read at the start).

        Not through ``rank_zero_info``: replicas that are threads of one process share Lightning's
        ``rank_zero_only.rank``, which holds whichever replica set it last (:func:`~xla_plugins.end_of_run.log_lines`).
        """
        end_of_run.run_ended(
            trainer,
            self.summary["stage"],
            self._done(trainer),
            self.summary,
            summary_lines(self.summary),
            self._global_zero,
        )

    def _done(self, trainer: Any) -> str:
        """What the run did in Lightning's counts: ``trainer.global_step`` for ``fit``, else the step calls."""
        stage = self.summary["stage"]
        if stage == "fit":
            return f"fit ended at trainer.global_step={trainer.global_step}"
        hook = {"validate": "validation_step", "test": "test_step", "predict": "predict_step"}.get(stage, "")
        batches = self.summary["step_calls"].get(hook, 0)
        return f"{stage} ran {batches} batch{'es' if batches != 1 else ''} ({hook})"

    def _summarize(self, stage: str) -> dict[str, Any]:
        step_calls: dict[str, int] = {}
        for phase in self.phases.values():
            if phase.hook in self._step_hooks:
                step_calls[phase.hook] = step_calls.get(phase.hook, 0) + phase.calls
        phases = [*self.phases.values(), self._outside]
        return run_summary(
            stage, phases, step_calls, len(self.reports), self._first, read_counters(), self.replica_threads
        )


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
    end_of_run.run_starts(trainer, monitored=chosen != "off")
    monitor = next((c for c in trainer.callbacks if isinstance(c, CompileMonitor)), None)
    if chosen == "off":
        unwrap_reads()
        if monitor is not None:  # left by an earlier run of this trainer: it must not report on this one
            trainer.callbacks.remove(monitor)
            remove_action_listener(trainer, monitor)
        return None
    if monitor is None:
        monitor = CompileMonitor(chosen)
        trainer.callbacks.append(monitor)
    monitor.budget = chosen
    monitor._start_run(trainer)
    # again after a run that raised: still one listener
    add_action_listener(trainer, monitor, monitor.hears, own_prefix=_OWN_HOOKS)
    wrap_reads(monitor)
    return monitor


# The budget's names, READ_METHODS and read_counters live in recompile_budget,
# host_reads and loop_phases; they stay importable from here, where the API reference named them
# before the split and the user guide names LateCompilationWarning and LateCompilationError.
__all__ = [
    "BUDGETS",
    "BUDGET_VARIABLE",
    "READ_METHODS",
    "WARMUP_CALLS",
    "CompileMonitor",
    "LateCompilationError",
    "LateCompilationWarning",
    "budget",
    "check_budget",
    "install",
    "read_counters",
    "replica_threads",
]
