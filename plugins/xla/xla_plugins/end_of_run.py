"""What xla-plugins prints when a run ends: one short line on global rank 0, the tables on request.

When a Trainer's ``fit``, ``validate``, ``test`` or ``predict`` ends (or, for Fabric, the process), the
compile monitor (:mod:`xla_plugins.compilation.compile_monitor`) and, for a ``fit``, the goodput ledger
(``trainer_plugins._goodput``, kept by :mod:`xla_plugins.long_runs._goodput`) have their figures.
Global rank 0 logs them (Lightning's rank-zero logger, on stderr by default) as chosen by
``XLA_PLUGINS_SUMMARY`` (:data:`SUMMARY_VARIABLE`):

* ``line`` (the default): one line, with figures a user can check against Lightning's own counts::

      xla-plugins: fit ended at trainer.global_step=64; 9 XLA compilations (2.2 s), none late; goodput 71.2% of 40.2 s

  (a Fabric loop: its training steps); ``validate``/``test``/``predict`` add no line of their own
  unless with a table (the line then gives the batches of the step hook, as ``Trainer.num_test_batches``
  etc. count them); and the tables below when something needs the user's attention:
  the compile monitor's table when it reported a cause in this run (its warnings came earlier), the
  goodput table when an attempt of the run was interrupted or steps were redone;
* ``tables``: the line, then both tables: the compile monitor's compilations and host reads per
  phase (``xla_plugins.compilation.compile_reports.summary_lines``) and the goodput ledger's buckets
  (``trainer_plugins.goodput_table_lines``; also ``trainer-plugins goodput <default_root_dir>``);
* ``off``: nothing (the compile monitor's reports are warnings and still come, see
  ``XLA_PLUGINS_RECOMPILES``).

The goodput ledger of a ``fit`` ends at the strategy's teardown, before the callbacks' ``teardown``
hooks where the compile monitor ends: :func:`ledger_finished` keeps it for the monitor's line
(:func:`run_ended`), or logs at once where no monitor runs (``XLA_PLUGINS_RECOMPILES=off``, or a run
that raised: the monitor then has no teardown).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any, Optional

import lightning_utilities.core.rank_zero as rank_zero_module

from trainer_plugins import RunLedger, _variables, goodput_summary_line, goodput_table_lines
from trainer_plugins._goodput_ledger import needs_attention

#: Variable that chooses what a run prints at its end: ``line`` (default), ``tables`` or ``off``.
SUMMARY_VARIABLE = "XLA_PLUGINS_SUMMARY"
SUMMARY_CHOICES = ("line", "tables", "off")

#: The trainers whose compile monitor logs the end of the run (at its ``teardown``), with the finished
#: goodput ledger it is to add (``None`` until the ledger finishes)
_monitored: weakref.WeakKeyDictionary[Any, Optional[RunLedger]] = weakref.WeakKeyDictionary()


def summary_choice() -> str:
    """``"line"`` (default, also when empty), ``"tables"`` or ``"off"``, from :data:`SUMMARY_VARIABLE`.

    Raises:
        ValueError: any other value; the message names the variable, the value and the choices.
    """
    return _variables.choice_from_environment(SUMMARY_VARIABLE, SUMMARY_CHOICES, "line")


def run_starts(trainer: Any, monitored: bool) -> None:
    """A run of ``trainer`` starts; ``monitored``: its compile monitor logs the end of the run (:func:`run_ended`).

    Raises:
        ValueError: ``XLA_PLUGINS_SUMMARY`` is not one of :data:`SUMMARY_CHOICES` (checked here, before the run).
    """
    summary_choice()
    if monitored:
        _monitored[trainer] = None
    else:
        _monitored.pop(trainer, None)


def ledger_finished(trainer: Any, ledger: RunLedger) -> None:
    """The goodput ledger of ``trainer``'s ``fit`` has finished: kept for the monitor's line, or logged now (rank 0)."""
    if trainer in _monitored:
        _monitored[trainer] = ledger
    else:
        log_lines(end_lines("fit", f"fit ended at trainer.global_step={trainer.global_step}", None, ledger))


def run_ended(
    trainer: Any, stage: str, done: str, summary: dict[str, Any], table: Sequence[str], global_zero: bool
) -> None:
    """The monitored run of ``trainer`` ends (the monitor's ``teardown``): global rank 0 logs its end.

    Args:
        trainer: the run's trainer (``None`` for Fabric).
        stage: ``"fit"``, ``"validate"``, ``"test"``, ``"predict"`` or ``"fabric"``.
        done: what the run did, in Lightning's counts (``"fit ended at trainer.global_step=64"``).
        summary: the compile monitor's summary (``CompileMonitor.summary``).
        table: the compile monitor's table of ``summary``, one string a line (``compile_reports.summary_lines``).
        global_zero: whether this replica is global rank 0 (the only one that logs).
    """
    ledger = _monitored.pop(trainer, None) if trainer is not None else None
    if global_zero:
        log_lines(end_lines(stage, done, summary, ledger, table))


def end_lines(
    stage: str,
    done: str,
    summary: Optional[dict[str, Any]],
    ledger: Optional[RunLedger],
    table: Sequence[str] = (),
) -> list[str]:
    """The lines to log at a run's end, by :func:`summary_choice` (see the module docstring).

    ``summary`` and ``table`` are the compile monitor's (``None`` and nothing where none ran), ``ledger``
    the goodput ledger's record of a ``fit`` (else ``None``).

    Raises:
        ValueError: ``XLA_PLUGINS_SUMMARY`` is not one of :data:`SUMMARY_CHOICES`.
    """
    choice = summary_choice()
    compile_table = summary is not None and (choice == "tables" or bool(summary["reports"]))
    goodput_table = ledger is not None and (choice == "tables" or needs_attention(ledger))
    if choice == "off" or (stage not in ("fit", "fabric") and not compile_table):
        return []  # an evaluation run's line only with its table: the fit's line is the run's
    parts = [done]
    if summary is not None:
        compilations, late = summary["compilations"], summary["late_compilations"]
        parts.append(
            f"{compilations} XLA compilation{'s' if compilations != 1 else ''} ({summary['compile_s']:.1f} s),"
            f" {late or 'none'} late"
        )
        if summary["reports"]:
            parts.append(f"{summary['reports']} cause(s) reported in warnings, table below")
    if ledger is not None:
        parts.append(goodput_summary_line(ledger))
    lines = ["xla-plugins: " + "; ".join(parts)]
    if compile_table and summary is not None:
        lines += table
    if goodput_table and ledger is not None:
        lines += goodput_table_lines(ledger)
    if choice == "line" and len(lines) == 1:
        lines[0] += f" ({SUMMARY_VARIABLE}=tables for details)"
    return lines


def log_lines(lines: list[str]) -> None:
    """Log ``lines`` to Lightning's rank-zero logger, without its rank check (the caller is global rank 0).

    Replica threads of one process share that check's rank (whichever thread set it last), so the
    callers check their own rank, read when their run started.
    """
    for line in lines:
        rank_zero_module.log.info(line)


__all__ = [
    "SUMMARY_CHOICES",
    "SUMMARY_VARIABLE",
    "end_lines",
    "ledger_finished",
    "log_lines",
    "run_ended",
    "run_starts",
    "summary_choice",
]
