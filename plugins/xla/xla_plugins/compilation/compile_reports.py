"""The compile monitor's texts: the report of a late event (where, why, its cost so far, the remedy), the summary.

For a late host read the line is the user's (:func:`xla_plugins.compilation.host_reads.user_line`). For a
compilation without a read (torch_xla compiles when the step's graph is run, inside Lightning's
optimizer step), the line is where the hook that built the graph is defined (:func:`hook_line`),
and the cause comes from the batch: new input shapes (compared with the shapes each loop saw
before), otherwise a graph that differs from the previous one for the same shapes.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

from xla_plugins.compilation import compile_cache
from xla_plugins.compilation.host_reads import SourceLine, is_own
from xla_plugins.compilation.loop_phases import Counts, Phase
from xla_plugins.compilation.recompile_budget import BUDGET_VARIABLE

#: What to change, by kind of cause: ``"shapes"``, ``"read"``, ``"graph"``.
_REMEDIES = {
    "shapes": "pad every batch to a fixed length or to a few bucketed lengths (a collate_fn with a fixed"
    " max_length, or lengths rounded up to a multiple of 64)",
    "read": "keep the value on the device (torch.where instead of `if`, accumulate in a tensor), log it with"
    " self.log(name, tensor) instead of .item() or print, and read it outside the step if at all",
    "graph": "keep Python values that change (the step number, a schedule) out of the traced operations:"
    " pass them as tensors, or make the branch a tensor operation (torch.where)",
}
#: Added to the remedy for new shapes in the training loop, where dropping a last partial batch loses no data
#: that counts (an evaluation loader's smaller last batch is expected: one compilation, not reported).
_TRAINING_SHAPES_REMEDY = ", and use drop_last=True in the training loader for a last partial batch"


def hook_line(trainer: Any, phase: Phase, step_hook: Optional[str] = None) -> Optional[SourceLine]:
    """The line where the hook that built the phase's graph starts: ``step_hook`` of the module if given.

    ``None`` where that hook is Lightning's own (not overridden) or not found.

    ``trainer`` is the run's ``lightning.pytorch.Trainer`` (``None`` outside a run: no line).
    """
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
    module = getattr(function, "__module__", None) or ""
    if is_own(module):  # Lightning's default hook: no code of the user's
        return None
    return SourceLine(code.co_filename, code.co_firstlineno, module, f"{type(owner).__name__}.{hook}")


def shapes_text(shapes: tuple) -> str:
    """A batch's input shapes as text: ``8x128, 8`` (``scalar`` for a 0-d tensor)."""
    return ", ".join("x".join(map(str, shape)) or "scalar" for shape in shapes) or "(no tensors)"


def report_text(
    phase: Phase,
    cause: str,
    total: Counts,
    why: str,
    line: Optional[SourceLine],
    where: Optional[str],
    warmup_calls: int,
    training: bool = True,
) -> str:
    """The report of a late event of kind ``cause`` (a key of ``_REMEDIES``) in ``phase``, with its cost ``total``.

    ``training``: the event is in the training loop (for new shapes, the remedy then names ``drop_last``).
    """
    remedy = _REMEDIES[cause] + (_TRAINING_SHAPES_REMEDY if cause == "shapes" and training else "")
    kind = "host read" if cause == "read" else "late compilation"
    when = (
        f"call {phase.calls}, after the warm-up of {warmup_calls}"
        if phase.calls > warmup_calls
        else "input shapes that follow other shapes in the same loop"
    )
    return (
        f"XLA compile monitor: {kind} in {where or phase.label} ({when}).\n"
        f"  line:   {line.text() if line is not None else 'not found in your code (Lightning or a library asked)'}\n"
        f"  why:    {why}\n"
        f"  cost:   {total.compilations} compilation(s), {total.compile_s:.2f} s compiling so far for this cause;"
        f" {total.host_reads} device-to-host transfer(s)\n"
        f"  remedy: {remedy}\n"
        f"  Reported once per cause and trainer; {BUDGET_VARIABLE}=error makes it an error, =off silences it."
    )


Totals = tuple[int, float, int]  # torch_xla's (compilations, compile seconds, transfers): loop_phases.read_counters


def run_summary(
    stage: str,
    phases: list[Phase],
    step_calls: dict[str, int],
    reports: int,
    first: Totals,
    last: Totals,
    replica_threads: int,
) -> dict[str, Any]:
    """The run's summary (``CompileMonitor.summary``): totals from torch_xla's counters, then the phases' counts.

    Args:
        stage: the run's stage (``"fit"``, ..., ``"fabric"``).
        phases: every phase of the run (those with nothing counted are left out).
        step_calls: the calls of each step hook (``{"training_step": 64, "validation_step": 18}``).
        reports: the causes reported.
        first: :func:`~xla_plugins.compilation.loop_phases.read_counters` when the run started.
        last: the same, now.
        replica_threads: the replicas whose compilations the counters add up
            (:func:`~xla_plugins.compilation.compile_monitor.replica_threads`).
    """
    phases = [p for p in phases if p.counts]
    tensor_reads = sum(p.counts.host_reads for p in phases)
    return {
        "stage": stage,
        "persistent_cache": compile_cache.cache_counts(),
        "compilations": last[0] - first[0],
        "compile_s": last[1] - first[1],
        "host_reads": last[2] - first[2],
        "host_reads_not_through_tensor_methods": last[2] - first[2] - tensor_reads,
        "late_compilations": sum(p.late_compilations for p in phases),
        "reports": reports,
        "steps": sum(step_calls.values()),
        "step_calls": dict(step_calls),
        "host_reads_in_steps": sum(p.counts.host_reads for p in phases if p.in_step),
        "replica_threads": replica_threads,
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


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The table of the run's summary ``summary`` (``CompileMonitor.summary``): the totals, then one line per phase.

    The calls of the step hooks are Lightning's: the sanity check's validation batches are among the
    ``validation_step`` calls, and ``training_step`` calls are ``trainer.global_step`` times
    ``accumulate_grad_batches`` for a fit that started at step 0.
    """
    calls = ", ".join(f"{hook} {count}" for hook, count in summary["step_calls"].items()) or "none"
    lines = [
        f"XLA compile monitor ({summary['stage']}): {summary['compilations']} compilation(s),"
        f" {summary['compile_s']:.2f} s compiling, {summary['late_compilations']} late;"
        f" {summary['host_reads']} host read(s), {summary['host_reads_in_steps']} of them inside steps;"
        f" {summary['reports']} cause(s) reported. Step calls: {calls}."
    ]
    for label, counts in summary["phases"].items():
        lines.append(
            f"  {label}: {counts['compilations']} compilation(s), {counts['compile_s']:.2f} s,"
            f" {counts['late_compilations']} late, {counts['host_reads']} host read(s) in {counts['calls']} call(s)"
        )
    lines.append(
        "  reads of logged metrics, the progress bar and checkpoints by Lightning and xla-plugins (one transfer"
        f" for many values; not per phase): {summary['host_reads_not_through_tensor_methods']} host read(s)"
    )
    threads = summary["replica_threads"]
    if threads > 1:
        lines.append(
            f"  {threads} replica threads share this process and torch_xla's counters: the counts are all of theirs,"
            " each phase's those seen while this replica ran it; a compilation is reported late only for new input"
            " shapes"
        )
    cache = summary.get("persistent_cache")
    if cache is not None:
        lines.append(
            f"  persistent compilation cache {compile_cache.enabled_folder()}: {cache['hits']} executable(s) read"
            f" back, {cache['misses']} compiled and written, {cache['unreadable']} found but unreadable (this process)"
        )
    return lines


__all__ = ["hook_line", "report_text", "run_summary", "shapes_text", "summary_lines"]
