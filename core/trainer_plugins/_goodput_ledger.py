"""The goodput ledger's accounts: where the wall time of a run went, attempt by attempt and for the whole run.

Pure data and arithmetic: no Lightning, no files (``trainer_plugins._goodput`` keeps the ledger of
a running ``fit``, ``trainer_plugins._goodput_record`` writes it to the run directory).

A **run** is one training from its first step to its last, however many processes it takes: the
first ``fit`` without a checkpoint starts it, and every later ``fit`` that resumes from one of its
checkpoints (``ckpt_path="last"`` after a stop or a crash) continues it as a new **attempt**. Each
attempt's wall time is split into the :data:`BUCKETS` (their exact boundaries are defined in
``trainer_plugins._goodput``); the buckets of an attempt add up to its wall time by construction.

**Lost work.** The steps an attempt trained after the checkpoint that a later attempt resumes from
are trained again by that later attempt. Their productive seconds are moved from the earlier
attempt's ``productive`` to ``lost`` (with their count, :attr:`Attempt.lost_steps`) when the later
attempt starts (:func:`resumed`), so the run's productive time counts every step once and its
buckets still add up to its wall time.

**Goodput** = the run's productive step seconds / its wall seconds (the sum of its attempts' wall
times; the time between two attempts, when no process of the run was running, is not in it).
"""

from __future__ import annotations

import copy
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

#: The buckets of an attempt's wall time, in the table's order, with their labels.
BUCKETS = {
    "startup": "start-up",
    "compilation": "compilation",
    "data": "data waiting",
    "productive": "productive steps",
    "validation": "validation",
    "checkpoint_save": "checkpoint save",
    "checkpoint_restore": "checkpoint restore",
    "teardown": "teardown",
}
#: The run-level bucket of the productive seconds of steps that a later attempt trained again.
LOST = "lost"
LOST_LABEL = "lost (steps redone)"
#: Version of the ledger's dict form (checkpoints and the run directory's record).
FORMAT_VERSION = 1


class LedgerFormatError(ValueError):
    """A ledger's dict form (from a checkpoint or a record file) is not one this version reads."""


@dataclass
class Attempt:
    """One process's part of a run: from its start to the end of its ``fit`` (or its last record).

    Attributes:
        number: 1 for the run's first attempt, then 2, 3, ...
        first_step: the global step it started training from (0, or the resumed checkpoint's).
        last_step: the global step it had reached at its last account.
        seconds: seconds per bucket of :data:`BUCKETS`; they add up to :attr:`wall_s`.
        lost_steps: its steps that a later attempt trained again (optimizer steps, as ``global_step``).
        lost_s: their productive seconds (part of ``seconds["productive"]``).
        ended: ``"finished"``, ``"stopped (<exception>)"``, or ``None`` while it runs, and for an attempt
            that ended without a last account (killed).
        resumed_from: the checkpoint it resumed from, if any.
        started_at: Unix time (s) of its start; :attr:`wall_s` later it had reached its last account.
    """

    number: int
    first_step: int = 0
    last_step: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0.0))
    lost_steps: int = 0
    lost_s: float = 0.0
    ended: Optional[str] = None
    resumed_from: Optional[str] = None
    started_at: float = 0.0

    @property
    def steps(self) -> int:
        """The optimizer steps it trained (``last_step - first_step``)."""
        return self.last_step - self.first_step

    @property
    def wall_s(self) -> float:
        """Its wall seconds: the sum of its buckets."""
        return sum(self.seconds.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "seconds": dict(self.seconds),
            "wall_s": self.wall_s,
            "lost_steps": self.lost_steps,
            "lost_s": self.lost_s,
            "ended": self.ended,
            "resumed_from": self.resumed_from,
            "started_at": self.started_at,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attempt:
        seconds = data["seconds"]
        if set(seconds) != set(BUCKETS):
            raise LedgerFormatError(f"an attempt's buckets are {sorted(seconds)}, expected {sorted(BUCKETS)}")
        return cls(
            number=int(data["number"]),
            first_step=int(data["first_step"]),
            last_step=int(data["last_step"]),
            seconds={name: float(seconds[name]) for name in BUCKETS},
            lost_steps=int(data["lost_steps"]),
            lost_s=float(data["lost_s"]),
            ended=data["ended"],
            resumed_from=data["resumed_from"],
            started_at=float(data["started_at"]),
        )


@dataclass
class RunLedger:
    """The accounts of one run: its attempts, in order (the last one may still be running).

    Attributes:
        run: the run's identity (a random hex string made by its first attempt).
        attempts: :class:`Attempt` objects, numbered from 1.
    """

    run: str
    attempts: list[Attempt]

    @classmethod
    def new(cls, first_step: int = 0) -> RunLedger:
        """A new run with its first attempt, starting at ``first_step``."""
        return cls(uuid.uuid4().hex, [Attempt(1, first_step=first_step, last_step=first_step)])

    @property
    def current(self) -> Attempt:
        """The last attempt (the running one, in a live ledger)."""
        return self.attempts[-1]

    def totals(self) -> dict[str, float]:
        """Run-level seconds per bucket of :data:`BUCKETS` and :data:`LOST`, and ``"wall"``.

        ``productive`` counts the steps once: the attempts' productive seconds less what became
        ``lost``. The buckets add up to ``"wall"``.
        """
        totals = {name: sum(a.seconds[name] for a in self.attempts) for name in BUCKETS}
        totals[LOST] = sum(a.lost_s for a in self.attempts)
        totals["productive"] -= totals[LOST]
        totals["wall"] = sum(a.wall_s for a in self.attempts)
        return totals

    @property
    def steps(self) -> int:
        """Productive steps: every attempt's steps less those trained again later (each step once)."""
        return sum(a.steps - a.lost_steps for a in self.attempts)

    @property
    def lost_steps(self) -> int:
        return sum(a.lost_steps for a in self.attempts)

    def goodput(self) -> float:
        """Productive step seconds / wall seconds of the run (0.0 before any wall time)."""
        totals = self.totals()
        return totals["productive"] / totals["wall"] if totals["wall"] > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """The ledger as plain data (JSON-ready): what checkpoints and the run directory's record hold."""
        return {
            "format": FORMAT_VERSION,
            "run": self.run,
            "attempts": [a.as_dict() for a in self.attempts],
            "totals": self.totals(),
            "steps": self.steps,
            "lost_steps": self.lost_steps,
            "goodput": self.goodput(),
        }

    @classmethod
    def from_dict(cls, data: Any) -> RunLedger:
        """The ledger :meth:`as_dict` made (``totals``, ``steps`` and ``goodput`` are recomputed).

        Raises:
            LedgerFormatError: ``data`` is not a ledger of format :data:`FORMAT_VERSION`; the message says why.
        """
        if not isinstance(data, dict) or data.get("format") != FORMAT_VERSION:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise LedgerFormatError(f"not a goodput ledger of format {FORMAT_VERSION} (found {found!r})")
        try:
            attempts = [Attempt.from_dict(item) for item in data["attempts"]]
            run = str(data["run"])
        except (KeyError, TypeError, ValueError) as error:
            raise LedgerFormatError(f"a goodput ledger with a missing or bad field: {error!r}") from error
        if not attempts:
            raise LedgerFormatError("a goodput ledger without attempts")
        return cls(run, attempts)


def resumed(snapshot: RunLedger, record: Optional[RunLedger], step: int, checkpoint: Optional[str]) -> RunLedger:
    """The ledger of a new attempt that resumes, at global step ``step``, from a checkpoint holding ``snapshot``.

    ``snapshot`` is the run's ledger as it was when the checkpoint was saved; its last attempt is
    the one that saved it. ``record`` is the run directory's record (it knows what came after the
    save: the rest of that attempt, and any attempt since), used when it belongs to the same run;
    otherwise the snapshot is the history. In the history, the steps after ``step`` become lost:

    * of the attempt that saved the checkpoint: its steps and productive seconds beyond the snapshot's;
    * of every later attempt: its steps after ``step``, with its productive seconds (all of them when
      it started at or after ``step``, else in proportion to its steps);

    an attempt keeps the larger of what was lost before and now. The new attempt is appended.
    """
    history = copy.deepcopy(record if record is not None and record.run == snapshot.run else snapshot)
    saver = snapshot.current
    for attempt in history.attempts:
        if attempt.number < saver.number:
            continue
        if attempt.number == saver.number:
            steps = attempt.last_step - max(saver.last_step, step)
            seconds = attempt.seconds["productive"] - saver.seconds["productive"]
        else:
            steps = attempt.last_step - max(attempt.first_step, step)
            share = steps / attempt.steps if attempt.steps > 0 else 1.0
            seconds = attempt.seconds["productive"] * min(max(share, 0.0), 1.0)
        attempt.lost_steps = max(attempt.lost_steps, steps, 0)
        attempt.lost_s = max(attempt.lost_s, seconds, 0.0)
    number = max(a.number for a in history.attempts) + 1
    history.attempts.append(Attempt(number, first_step=step, last_step=step, resumed_from=checkpoint))
    return history


def metrics(ledger: RunLedger) -> dict[str, float]:
    """What the user's loggers get at each epoch end: the run's goodput and seconds per bucket.

    Keys: ``goodput`` (a fraction), ``goodput/<bucket>_s`` for each of :data:`BUCKETS` and
    :data:`LOST`, ``goodput/wall_s``, ``goodput/steps``, ``goodput/lost_steps``, ``goodput/attempts``.
    """
    totals = ledger.totals()
    found = {"goodput": ledger.goodput()}
    found.update({f"goodput/{name}_s": totals[name] for name in (*BUCKETS, LOST)})
    found["goodput/wall_s"] = totals["wall"]
    found["goodput/steps"] = float(ledger.steps)
    found["goodput/lost_steps"] = float(ledger.lost_steps)
    found["goodput/attempts"] = float(len(ledger.attempts))
    return found


def goodput_summary_line(ledger: RunLedger) -> str:
    """The ledger in a few words, for a backend's one line at the end of a ``fit``: ``goodput 71.2% of 512.3 s``.

    The goodput is the run's (all its attempts; see the module docstring), the seconds its wall time.
    """
    return f"goodput {ledger.goodput():.1%} of {ledger.totals()['wall']:.1f} s"


def needs_attention(ledger: RunLedger) -> bool:
    """Whether the run's ledger holds something a user should look at: an attempt interrupted, or steps redone.

    An attempt known only from a checkpoint's snapshot (``ended`` is ``None``: the snapshot was taken
    while it ran, and no record tells how it ended) is not taken for interrupted.
    """
    return ledger.lost_steps > 0 or any(a.ended not in (None, "finished") for a in ledger.attempts)


def goodput_table_lines(ledger: RunLedger) -> list[str]:
    """The ledger's table (``trainer-plugins goodput``, and a backend's tables on request): one line a bucket.

    ``Goodput 71.2% over 512.3 s wall time: 1200 productive steps, 2 attempts (1 interrupted)`` then,
    for each bucket, its label, seconds and share of the wall time.
    """
    totals = ledger.totals()
    wall = totals["wall"]
    interrupted = sum(1 for a in ledger.attempts if a.ended != "finished")
    attempts = f"{len(ledger.attempts)} attempt{'s' if len(ledger.attempts) != 1 else ''}"
    if interrupted:
        attempts += f" ({interrupted} interrupted)"
    lines = [f"Goodput {ledger.goodput():.1%} over {wall:.1f} s wall time: {ledger.steps} productive steps, {attempts}"]
    labels = {**BUCKETS, LOST: LOST_LABEL}
    width = max(len(label) for label in labels.values())
    for name in (*BUCKETS, LOST):
        share = totals[name] / wall if wall > 0 else 0.0
        steps = ledger.lost_steps
        extra = f"  ({steps} step{'s' if steps != 1 else ''})" if name == LOST and steps else ""
        lines.append(f"  {labels[name]:<{width}}  {totals[name]:9.1f} s  {share:6.1%}{extra}")
    return lines
