"""The replica watch: replicas stamp their progress, a thread of each worker reports one that stopped.

A replica makes progress on every batch, optimizer step and collective of its strategy
(:class:`ReportsProgress`) and when its function returns; one that makes none for
:data:`REPLICA_TIMEOUT_VARIABLE` seconds is reported to the main process as a
:class:`~xla_plugins.strategies.launchers._failures.ReplicaHangError`, with every replica's stack.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable
from types import FrameType
from typing import Any, Optional

from trainer_plugins._variables import seconds_from_environment
from xla_plugins.strategies.launchers._failures import ReplicaHangError, _Channel

#: Environment variable: seconds a replica may go without progress (a batch, an optimizer step, a
#: collective of its strategy: see :func:`progress`) before it is reported as hung
#: and the run stops. ``0`` turns the watch off. Default :data:`DEFAULT_REPLICA_TIMEOUT_S`. Read in
#: the main process when the workers start. Give a value above the longest XLA compilation a step
#: can take (a large model's: many minutes) and above the longest work of your own between two steps.
REPLICA_TIMEOUT_VARIABLE = "XLA_PLUGINS_REPLICA_TIMEOUT"
#: Default of :data:`REPLICA_TIMEOUT_VARIABLE`: 30 minutes.
DEFAULT_REPLICA_TIMEOUT_S = 1800.0
#: Seconds between two looks at the replicas' progress stamps.
_SAMPLE_INTERVAL_S = 0.5
_STDLIB = sysconfig.get_paths()["stdlib"]


def replica_timeout() -> Optional[float]:
    """Seconds from :data:`REPLICA_TIMEOUT_VARIABLE` (default :data:`DEFAULT_REPLICA_TIMEOUT_S`); ``None`` if ``0``.

    Raises:
        ValueError: the variable is not a number of seconds >= 0 (the message names it and its value).
    """
    seconds = seconds_from_environment(
        REPLICA_TIMEOUT_VARIABLE,
        DEFAULT_REPLICA_TIMEOUT_S,
        "the seconds a replica may make no progress before the run stops (0 turns the watch off)",
    )
    return seconds or None


class _Watchdog:
    """Reports a replica of this worker that made no progress (see :func:`progress`) for longer than the timeout.

    The replicas stamp the time of their progress into a dictionary; the watch's thread only
    compares those times with the clock, twice a second. It reads the replicas' Python stacks
    (``sys._current_frames``) once, to write the report, when the run is already given up. The
    replica reported is the one whose progress is oldest: when one replica hangs, the others
    soon wait for it in a collective, which they entered later.
    """

    def __init__(self, channel: _Channel, timeout: float) -> None:
        self._channel = channel
        self._timeout = timeout
        self._ranks: dict[int, int] = {}  # thread id -> rank
        self._stamps: dict[int, float] = {}  # thread id -> time.monotonic() of its latest progress
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None

    def watch(self, rank: int) -> None:
        """Watch the calling thread, the replica of ``rank``, from now on."""
        ident = threading.get_ident()
        with self._lock:
            self._stamps[ident] = time.monotonic()
            self._ranks[ident] = rank
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="xla-replica-watchdog", daemon=True)
                self._thread.start()

    def forget(self) -> None:
        """Stop watching the calling thread."""
        ident = threading.get_ident()
        with self._lock:
            self._ranks.pop(ident, None)
            self._stamps.pop(ident, None)

    def stamp(self) -> None:
        """Record that the calling thread made progress (a dictionary store: no lock, no frame is read)."""
        ident = threading.get_ident()
        if ident in self._ranks:
            self._stamps[ident] = time.monotonic()

    def _run(self) -> None:
        while True:
            time.sleep(_SAMPLE_INTERVAL_S)
            with self._lock:
                ranks, stamps = dict(self._ranks), dict(self._stamps)
            now = time.monotonic()
            overdue = [(stamp, ident) for ident, stamp in stamps.items() if now - stamp >= self._timeout]
            if overdue:
                stamp, ident = min(overdue)
                self._report(ident, now - stamp, ranks)

    def _report(self, ident: int, still: float, ranks: dict[int, int]) -> None:
        """Report the replica of thread ``ident`` (still for ``still`` s) with every replica's stack; end the worker."""
        rank = ranks[ident]
        frames = sys._current_frames()
        stack = _replica_stack(frames.get(ident))
        own = [f for f in stack if not f.f_code.co_filename.startswith(_STDLIB)] or stack  # skip threading's waits
        where = f"{own[0].f_code.co_filename}:{own[0].f_lineno} in {own[0].f_code.co_name}" if own else "?"
        in_xla = any(f.f_globals.get("__name__", "").startswith("torch_xla") for f in stack)
        message = (
            f"The XLA replica of rank {rank} made no progress for {still:.0f} s"
            f" ({'waiting inside torch_xla; ' if in_xla else ''}stuck at {where})."
            f" {REPLICA_TIMEOUT_VARIABLE}={self._timeout:g} s; set it higher if this step legitimately takes longer."
        )
        sections = []
        for other_ident, other in sorted(ranks.items(), key=lambda item: item[1]):
            if other_ident in frames:
                frames_above_entry = traceback.StackSummary.extract(
                    (f, f.f_lineno) for f in reversed(_replica_stack(frames[other_ident]))
                )
                sections.append(f"Replica of rank {other} is at:\n{''.join(frames_above_entry.format())}")
        try:
            self._channel.report(rank, ReplicaHangError(message, rank), text="\n".join(sections))
        finally:
            os._exit(1)


#: This worker's watch (``None`` in the main process, and when the watch is off).
_watchdog: Optional[_Watchdog] = None


def start_watchdog(channel: _Channel, timeout: Optional[float]) -> None:
    """Give this worker a watch reporting on ``channel`` after ``timeout`` s without progress (``None``: no watch)."""
    global _watchdog
    _watchdog = _Watchdog(channel, timeout) if timeout else None


def _run_one_replica(channel: _Channel, wrapping_function: Callable[..., None], args: tuple[Any, ...]) -> None:
    """One replica thread of a worker, watched (its frame marks where the replica's own stack begins)."""
    import torch_xla.runtime as xr

    rank = xr.global_ordinal()
    channel.send("started", rank)
    if _watchdog is not None:
        _watchdog.watch(rank)
    try:
        wrapping_function(rank, *args, channel, channel)
    finally:
        if _watchdog is not None:
            _watchdog.forget()


def _replica_stack(frame: Optional[FrameType]) -> list[FrameType]:
    """The frames of a replica thread above its entry (innermost first)."""
    stack = []
    while frame is not None and frame.f_code is not _run_one_replica.__code__:
        stack.append(frame)
        frame = frame.f_back
    return stack


def progress() -> None:
    """Record that the calling replica made progress, for the replica watch (:data:`REPLICA_TIMEOUT_VARIABLE`).

    The multi-device strategies call it on every batch the Trainer moves, optimizer step and
    collective (:class:`ReportsProgress`); the launchers when a replica's function returns. It does nothing
    where no watch runs.
    """
    if _watchdog is not None:
        _watchdog.stamp()


def _then_progress(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)``, then :func:`progress`: a replica that returned waits for the others next."""
    result = function(*args, **kwargs)
    progress()
    return result


class ReportsProgress:
    """Mixin of the multi-device strategies: batches, optimizer steps and collectives are progress.

    Each calls :func:`progress` first. ``backward`` is left alone: Fabric takes a strategy that
    overrides it as one that needs ``fabric.backward(loss)``, and would refuse ``loss.backward()``.
    Between two of these, a replica may run for up to the replica timeout before it is reported as
    hung (work of its own in a callback, an XLA compilation or execution included).
    """

    def batch_to_device(self, *args: Any, **kwargs: Any) -> Any:
        progress()
        return super().batch_to_device(*args, **kwargs)  # type: ignore[misc]

    def optimizer_step(self, *args: Any, **kwargs: Any) -> Any:
        progress()
        return super().optimizer_step(*args, **kwargs)  # type: ignore[misc]

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        progress()
        super().barrier(*args, **kwargs)  # type: ignore[misc]

    def broadcast(self, *args: Any, **kwargs: Any) -> Any:
        progress()
        return super().broadcast(*args, **kwargs)  # type: ignore[misc]

    def all_gather(self, *args: Any, **kwargs: Any) -> Any:
        progress()
        return super().all_gather(*args, **kwargs)  # type: ignore[misc]
