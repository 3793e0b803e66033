"""Fabric's XLA strategies on a stop signal: the write in flight completes, and the loop may save and exit.

Lightning's Fabric installs no signal handler: SIGTERM (a preemption notice) ends the process at
once, cutting short a ``fabric.save`` written in the background. :class:`FabricStopsOnSignal` installs
one, for SIGTERM and the signals named by ``XLA_PLUGINS_CHECKPOINT_SIGNALS``, when Fabric sets the
strategy up (``fabric.launch()``, or the first ``fabric.setup``):

* a loop that reads ``fabric.strategy.received_sigterm`` (Lightning's name of the Trainer's flag)
  handles the stop itself: the signal only sets the flag, and the loop, seeing it, saves with
  ``fabric.save`` and calls ``fabric.strategy.exit_after_stop()``, which waits for the write and
  exits with 128 + the signal number (143 for SIGTERM). Resuming is the loop's ``fabric.load``;
* a loop that never read the flag ends at the signal, after the write in flight has completed,
  with the same status; the last complete checkpoint is then the one before the signal. Where the
  script had installed its own handler for that signal before (or Python has one, as for SIGINT),
  that handler runs instead (after the flag is set, where the loop reads it);
* either way, if the process has not ended within ``XLA_PLUGINS_CHECKPOINT_DEADLINE`` seconds of the
  signal, it logs that and ends at once with that status (the checkpoints written earlier stay whole:
  they are committed by a rename, :mod:`trainer_plugins.long_runs._commits`).

Ranks agree on the stop: every read of ``received_sigterm`` is where they agree, so every rank
sees ``True`` at the same read (on several hosts under the SPMD strategies a collective over the
hosts' group, :func:`~xla_plugins.long_runs._stop_agreement.agreed_signal`; in the spawn
strategy's replicas the launcher's agreement of the host,
:class:`~xla_plugins.long_runs._stop_agreement.HostStop`, counting reads as its batches). The
Trainer's counterpart is :mod:`xla_plugins.long_runs._preemption`.
"""

from __future__ import annotations

import signal
import threading
from typing import Any, NoReturn, Optional

from trainer_plugins.long_runs._preemption import _Stop
from trainer_plugins.long_runs._stop_settings import checkpoint_signals, deadline_s, exit_status
from xla_plugins._logging import log
from xla_plugins.long_runs import _stop_agreement
from xla_plugins.long_runs._stop_agreement import agreed_signal, several_hosts


def _before_fabric(signum: int, handler: Any) -> Any:
    """The handler that was there before any Fabric's: ``handler``, or the one a handler of ours had replaced.

    A Fabric script never tears its strategy down, so an earlier Fabric of the process (a notebook's
    previous cell) leaves its handler installed; the new strategy takes its place instead of deferring
    to it, and keeps what it had replaced (the script's own handler, or Python's default).
    """
    owner = getattr(handler, "__self__", None)
    if isinstance(owner, FabricStopsOnSignal) and getattr(handler, "__func__", None) is FabricStopsOnSignal._received:
        return (owner._handlers_before or {}).get(signum, signal.SIG_DFL)
    return handler


class FabricStopsOnSignal:
    """Mixin for Fabric's XLA strategies: stop signals set ``received_sigterm``, or end the loop after the write.

    See the module docstring. The handlers are installed in ``setup_environment`` (on the main
    thread; a spawn replica uses its launcher's) and the earlier ones are put back by ``teardown``.

    Raises:
        ValueError: ``XLA_PLUGINS_CHECKPOINT_SIGNALS`` or ``XLA_PLUGINS_CHECKPOINT_DEADLINE`` is invalid (in
            ``setup_environment``; see :mod:`trainer_plugins.long_runs._stop_settings`).
    """

    _fabric_stop: Optional[_Stop] = None
    _loop_reads_stop = False  # the loop has read received_sigterm: it handles the stop
    _handlers_before: Optional[dict[int, Any]] = None
    _reads = threading.local()  # per replica thread: (launch's HostStop, reads of received_sigterm in it)

    def setup_environment(self) -> None:
        signals = checkpoint_signals()
        deadline_s()  # a bad value fails now, not when the signal arrives
        super().setup_environment()  # type: ignore[misc]
        if self._fabric_stop is None:
            self._fabric_stop = _Stop()
        if _stop_agreement.host_stop is not None or self._handlers_before is not None:
            return  # a spawn replica (its launcher's handlers agree), or installed already
        if threading.current_thread() is not threading.main_thread():
            return  # Python takes signals on the main thread only
        self._handlers_before = {
            signum: _before_fabric(signum, signal.signal(signum, self._received)) for signum in signals
        }

    def teardown(self) -> None:
        """Put back the signal handlers that were installed before ``setup_environment``, then Lightning's teardown."""
        if self._handlers_before is not None:
            for signum, handler in self._handlers_before.items():
                signal.signal(signum, handler)
            self._handlers_before = None
        super().teardown()  # type: ignore[misc]

    def _received(self, signum: int, frame: Any) -> None:
        """Signal handler: note the stop for the loop, or, where the loop never read the flag, end the process."""
        stop = self._fabric_stop
        assert stop is not None
        if self._loop_reads_stop:
            stop.start(signum, "the loop stops when it next reads `fabric.strategy.received_sigterm`")
        earlier = (self._handlers_before or {}).get(signum)
        if callable(earlier):  # the script's own handler (or Python's for SIGINT), installed before: it decides
            earlier(signum, frame)
            return
        if self._loop_reads_stop:
            return
        stop.start(signum, announce=False)
        log.warning(
            "Received %s: the loop does not read `fabric.strategy.received_sigterm`, so it ends now, once the"
            " checkpoint write in flight (if any) is complete.",
            signal.Signals(signum).name,
        )
        self._exit(signum, every_rank=False)  # the other ranks may not be at a barrier: this process's write only

    @property
    def received_sigterm(self) -> bool:
        """Whether the run was told to stop (SIGTERM or ``XLA_PLUGINS_CHECKPOINT_SIGNALS``), agreed by all ranks.

        Reading it tells the strategy that the loop handles the stop: from then on a signal only
        sets it, and the loop saves and calls :meth:`exit_after_stop`. Every rank must read it at
        the same points of the loop (once per step, say): on several hosts each read is a
        collective, and in the spawn strategy the replicas agree by counting reads.
        """
        self._loop_reads_stop = True
        stop = self._fabric_stop
        if stop is None:  # read before the strategy was set up
            return False
        signum = stop.signum
        host_stop = _stop_agreement.host_stop
        if host_stop is not None:  # a replica of the spawn strategy
            host_stop.loop_reads_flag()
            launch, reads = getattr(self._reads, "count", (None, 0))
            reads = reads + 1 if launch is host_stop else 1
            self._reads.count = (host_stop, reads)
            signum = host_stop.batch_started(reads)
        elif several_hosts(self):
            signum = agreed_signal(self, signum)
        if signum is None:
            return False
        stop.start(signum, announce=False)
        return True

    def exit_after_stop(self) -> NoReturn:
        """End the run after a stop signal: wait for this process's checkpoint write, then every rank's, then exit.

        Raises ``SystemExit`` with 128 + the signal number (143 for SIGTERM), the status a shell gives
        a process ended by that signal; the interpreter's exit waits for any write still in flight.

        Raises:
            RuntimeError: no stop signal was received (``received_sigterm`` is ``False``).
            SystemExit: the stop, see above.
        """
        stop = self._fabric_stop
        signum = stop.signum if stop is not None else None
        if stop is None or signum is None:
            raise RuntimeError(
                "`exit_after_stop()` ends a run told to stop, but no stop signal was received: call it only once"
                " `fabric.strategy.received_sigterm` is True."
            )
        self._exit(signum, every_rank=True)

    def _exit(self, signum: int, every_rank: bool) -> NoReturn:
        name = "wait_for_checkpoints_of_every_rank" if every_rank else "wait_for_checkpoint_writes"
        wait = getattr(self, name, None)
        if callable(wait):
            wait()
        assert self._fabric_stop is not None
        self._fabric_stop.finish()
        status = exit_status(signum)
        log.warning(
            "Stopped by %s: every checkpoint saved before is complete. Exiting with status %d.",
            signal.Signals(signum).name,
            status,
        )
        raise SystemExit(status)
