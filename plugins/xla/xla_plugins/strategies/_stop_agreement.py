"""Where the replicas of a run agree on the batch after which they all stop, when a stop signal reaches one.

**The replicas of one host** (the spawn strategy, ``"xla"``) run Lightning's loop in replica threads
or worker processes, where Python takes no signal: a signal to the main process or to any worker
fixes, in shared memory, the batch after which all replicas of the host stop (:class:`HostStop`,
:func:`workers_stop_together`).

**The hosts of a slice** (one process per host: the SPMD strategies). A stop signal may reach one
host only (a preemption notice of one VM, a scheduler's signal to one process). Each host's Python
runs the same steps in lock-step with the others, because every step's program holds collectives
across all hosts; a host that stopped alone would leave the others waiting in the next one, or in
the stop checkpoint's collectives. So with several hosts no host stops on its own signal: at the
start of every training batch the hosts reduce the signal each one has received (``0`` for none)
with a maximum over their gloo process group (:class:`~xla_plugins.strategies._hosts.HostGroup`),
and all see the same answer at the same batch: they all stop after that batch (at the end of its
accumulation window), and write the stop checkpoint together. The cost is one all-reduce of one
integer over the hosts' CPU group a training batch, on several hosts only (on one host nothing
runs). A signal therefore stops the run one batch after the batch in flight when it arrived.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any, Optional

from xla_plugins._logging import log
from xla_plugins.strategies._stop_settings import checkpoint_signals, deadline_s


def several_hosts(strategy: Any) -> bool:
    """Whether ``strategy`` runs on several hosts with one process each (its ``hosts`` group spans more than one)."""
    hosts = getattr(strategy, "hosts", None)
    return bool(hosts is not None and hosts.several)


def agreed_signal(strategy: Any, signum: Optional[int]) -> Optional[int]:
    """The stop signal any host of ``strategy``'s run has received (the largest number), or ``None`` if none has.

    Every host must call it at the same point of the loop (a collective over the hosts' group).

    Args:
        strategy: a strategy with a ``hosts`` :class:`~xla_plugins.strategies._hosts.HostGroup`.
        signum: the signal this host received, or ``None``.
    """
    agreed = int(strategy.hosts.reduce(int(signum or 0), "max"))
    return agreed or None


#: Batches a replica of the spawn strategy runs after the most advanced replica's current one before it stops.
#: Every replica checks the agreed batch when it starts a batch; with 2, a replica that started its next
#: batch while the stop was being agreed still stops at the agreed one.
STOP_MARGIN_BATCHES = 2


class HostStop:
    """Where the replicas of one host agree on the batch after which they all stop (the spawn strategy).

    Three integers in shared memory, made before the workers fork: the most batches any replica has
    started, the batch after which all stop (0: none yet) and the signal. A stop request (the signal
    handler of the main process or of any worker, which inherit it) sets the stop batch to the
    first plus :data:`STOP_MARGIN_BATCHES`; each replica compares it with its own count when it
    starts a batch. No device value is read: the check is two reads of shared memory a batch.
    """

    def __init__(self, context: Any) -> None:
        self._values = context.RawArray("q", 3)

    def request(self, signum: int, frame: Any = None) -> None:
        """Signal handler: agree on a stop batch, once."""
        if self._values[1] == 0:
            self._values[2] = int(signum)
            self._values[1] = self._values[0] + STOP_MARGIN_BATCHES
            log.warning(
                "Received %s: every replica stops after batch %d of this fit, then a checkpoint is written.",
                signal.Signals(signum).name,
                self._values[1],
            )

    def batch_started(self, batches: int) -> Optional[int]:
        """Record that a replica started its batch number ``batches`` (from 1); the signal if it is the last."""
        if batches > self._values[0]:
            self._values[0] = batches
        stop = self._values[1]
        return int(self._values[2]) if stop and batches >= stop else None


#: The agreement of the spawn strategy's replicas on this host (``None`` outside a spawn launch).
host_stop: Optional[HostStop] = None


@contextlib.contextmanager
def workers_stop_together(context: Any) -> Iterator[None]:
    """While the spawn strategy's workers run: the stop signals make every replica stop after one agreed batch.

    The main process's handlers, installed here, are inherited by the forked workers, so a signal to
    the main process or to any worker makes the same request (:class:`HostStop`).

    Args:
        context: the ``multiprocessing`` context the workers are started with.

    Raises:
        ValueError: ``XLA_PLUGINS_CHECKPOINT_SIGNALS`` or ``XLA_PLUGINS_CHECKPOINT_DEADLINE`` is invalid.
    """
    global host_stop
    signals = checkpoint_signals()
    deadline_s()
    outer, host_stop = host_stop, HostStop(context)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {signum: signal.signal(signum, host_stop.request) for signum in signals}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        host_stop = outer
