"""Where the replicas of a run agree on the batch after which they all stop, when a stop signal reaches one.

**The replicas of one host** (the spawn strategy, ``"xla"``) run Lightning's loop in replica threads
or worker processes, where Python takes no signal: a signal to the main process or to any worker
fixes, in shared memory, the batch after which all replicas of the host stop (:class:`HostStop`,
:func:`workers_stop_together`).

**The spawn strategy on several hosts.** The hosts share no memory, and a signal may reach one of
them only. There the batch a host's signal fixed is a request only: at the start of every training
batch the first replica of each worker process (:func:`~xla_plugins.runtime._world.leads_its_process`)
takes, over a gloo group of the worker processes (:class:`WorkerGroup`, one rank per process, on
the store of torch_xla's ``xla://`` rendezvous), the maximum of the signal its host
received and of the batches its host's replicas started; once a signal is in, every host sets the
same stop batch, the most batches any replica started plus :data:`STOP_MARGIN_BATCHES`, and every
replica stops there. The replicas of all hosts run in lock-step (every step's program holds
collectives over all of them), so none has passed that batch when it is set. The cost is one
all-reduce of three integers over the CPU group a training batch in each worker process, on
several hosts only (:func:`spawn_hosts`).

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
import datetime
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Optional

from trainer_plugins.long_runs import _loader_position, _stop_settings
from trainer_plugins.long_runs._stop_settings import checkpoint_signals, deadline_s, exit_status
from xla_plugins._logging import log
from xla_plugins.checkpoints.checkpoint_io import finish_pending_writes
from xla_plugins.runtime import _probes
from xla_plugins.runtime._world import World, leads_its_process, one_rank_per_process

if TYPE_CHECKING:
    from torch import Tensor

# the names the long-run settings and the checkpoints' loader positions had before they moved to the core,
# read by every XLA strategy that stops on a signal (the Trainer's XLA strategies all do)
_stop_settings.accept_aliases("XLA_PLUGINS")
_loader_position.accept_earlier_key("xla_plugins_loader_positions")


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


#: Where the spawn strategy's worker processes meet to form their group (``torch.distributed.rendezvous``):
#: torch_xla's ``xla://``, whose store (a ``TCPStore`` at the master worker, ``MASTER_ADDR``/``MASTER_PORT``
#: override it) is shared by every ``xla://`` group of the process. Tests of simulated hosts set a
#: ``file://`` URL here before the workers fork.
RENDEZVOUS = "xla://"
#: The prefix of the group's keys in that store.
STORE_PREFIX = "xla_plugins/stop_agreement"
#: How long the group's collectives wait for a worker process (torch.distributed's default, 30 minutes).
GROUP_TIMEOUT = datetime.timedelta(minutes=30)


class WorkerGroup:
    """The worker processes of a spawn run on several hosts, as a gloo process group of their own.

    One rank per worker process (:func:`~xla_plugins.runtime._world.one_rank_per_process`), on the store of
    :data:`RENDEZVOUS` under :data:`STORE_PREFIX`. Not ``torch.distributed``'s default group: once
    that one exists, Lightning's training loop broadcasts over it from every replica at every
    batch (Lightning 2.6's ``_broadcast_sigterm_tensor``), which the replica threads of one
    process, sharing it, cannot do in one order with the other hosts.

    Args:
        world: the worker process's :class:`~xla_plugins.runtime._world.World` (one rank per process).

    Raises:
        RuntimeError: the rendezvous failed or timed out (torch.distributed's error), or, in
            :meth:`maximum`, a worker process left the group (gloo's error).
    """

    def __init__(self, world: World) -> None:
        import torch.distributed as dist
        import torch_xla.distributed.xla_backend  # noqa: F401  registers the xla:// rendezvous

        store, _, _ = next(dist.rendezvous(RENDEZVOUS, rank=world.global_rank, world_size=world.world_size))
        prefixed = dist.PrefixStore(STORE_PREFIX, store)
        # torch's own ProcessGroupGloo bindings (their stubs lack allreduce); the timeout is torch.distributed's default
        self._group: Any = dist.ProcessGroupGloo(prefixed, world.global_rank, world.world_size, GROUP_TIMEOUT)

    def maximum(self, values: Tensor) -> Tensor:
        """The element-wise maximum of ``values`` (a CPU tensor) over the worker processes; a collective."""
        import torch.distributed as dist

        options: Any = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.MAX
        self._group.allreduce([values], options).wait()
        return values


def spawn_hosts() -> Optional[WorkerGroup]:
    """For a replica of the spawn strategy on several hosts: its :class:`WorkerGroup` if it leads its worker process.

    ``None`` for the other replicas of a process. Called by every replica of a run on several hosts
    (in its own thread: the runtime figures are the thread's) when training starts; the leading
    replicas of all worker processes form the group together.

    Raises:
        ValueError: inconsistent runtime figures (:func:`~xla_plugins.runtime._world.check_figures`).
        RuntimeError: the group's rendezvous failed (torch.distributed's error).
    """
    figures = _probes.runtime_figures()
    if not leads_its_process(figures):
        return None
    return WorkerGroup(one_rank_per_process(figures))


class HostStop:
    """Where the replicas of one host agree on the batch after which they all stop (the spawn strategy).

    Five integers in shared memory, made before the workers fork: the most batches any replica of
    the host has started, the host's stop batch (0: none yet), the signal, the stop batch the hosts
    agreed on (several hosts; 0: none yet) and whether the run spans several hosts. A stop request
    (the signal handler of the main process or of any worker, which inherit it) sets the host's
    stop batch to the first plus :data:`STOP_MARGIN_BATCHES`; each replica compares it with its own
    count when it starts a batch. On several hosts the replicas compare with the agreed batch
    instead, which :meth:`batch_started` sets in the replicas that lead their processes. No device
    value is read: the check is a few reads of shared memory a batch.

    On several hosts the other replica threads of a worker process start a batch only once their
    process's leading replica has taken part in that batch's agreement, so none waits in a device
    collective for a replica that waits for another host (XLA:CPU aborts a collective that waits
    more than 10 s for a thread; a host that starts or compiles later than another makes the wait).
    """

    def __init__(self, context: Any, ends_unless_read: bool = False) -> None:
        self._values = context.RawArray("q", 6)  # the five above, then: a replica read the stop flag (Fabric)
        self._ends_unless_read = ends_unless_read
        self._main_pid = os.getpid()
        # In each worker process (its own copy after the fork): the batches its leading replica has agreed on.
        self._agreed_here = 0
        self._agreement = threading.Condition()

    def request(self, signum: int, frame: Any = None) -> None:
        """Signal handler: fix this host's stop batch, once; under Fabric, end the run if no replica reads the flag.

        That end (:meth:`loop_reads_flag` never called): the main process passes the signal on to its
        worker processes; a worker waits for its checkpoint writes in flight
        (:func:`~xla_plugins.checkpoints.checkpoint_io.finish_pending_writes`) and ends with 128 + the signal
        number, which the main process then ends with too.
        """
        self._record(signum)
        if not self._ends_unless_read or self._values[5]:
            return
        if os.getpid() == self._main_pid:
            for child in multiprocessing.active_children():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signum)  # type: ignore[arg-type]
            return
        log.warning(
            "Received %s: the loop does not read `fabric.strategy.received_sigterm`, so the worker ends now, once"
            " its checkpoint write in flight (if any) is complete.",
            signal.Signals(signum).name,
        )
        try:
            finish_pending_writes()
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(BaseException):
                    stream.flush()
            os._exit(exit_status(signum))

    def loop_reads_flag(self) -> None:
        """Note that the replicas' loop reads the stop flag (Fabric's ``received_sigterm``): a signal only sets it."""
        self._values[5] = 1

    def _record(self, signum: int) -> None:
        if self._values[1] == 0:
            self._values[2] = int(signum)
            self._values[1] = self._values[0] + STOP_MARGIN_BATCHES
            if self._values[4]:
                log.warning(
                    "Received %s: every replica of every host stops after the batch the hosts agree on at the"
                    " next batch, then a checkpoint is written.",
                    signal.Signals(signum).name,
                )
            else:
                log.warning(
                    "Received %s: every replica stops after batch %d of this fit, then a checkpoint is written.",
                    signal.Signals(signum).name,
                    self._values[1],
                )

    def spans_hosts(self) -> None:
        """Note that the run spans several hosts (only the wording of :meth:`request`'s log line depends on it)."""
        self._values[4] = 1

    def requested_signal(self) -> Optional[int]:
        """The signal of this host's stop request or of the hosts' agreement, or ``None`` if there is neither."""
        return int(self._values[2]) if self._values[1] or self._values[3] else None

    def batch_started(
        self, batches: int, hosts: Optional[WorkerGroup] = None, several_hosts: bool = False
    ) -> Optional[int]:
        """Record that a replica started its batch number ``batches`` (from 1); the signal if it is the last.

        Args:
            batches: the replica's count of training batches started in this fit.
            hosts: for the replica that leads its process on several hosts, the worker processes'
                group (:func:`spawn_hosts`): it takes part in the agreement first (a collective:
                the leading replica of every worker process of every host calls it at the same batch).
            several_hosts: whether the run spans several hosts: the last batch is then the agreed one,
                and a replica that does not lead its process waits for its leader's agreement.
        """
        if batches > self._values[0]:
            self._values[0] = batches
        if hosts is not None:
            self._agree(hosts)
            with self._agreement:
                self._agreed_here = batches
                self._agreement.notify_all()
        elif several_hosts:  # wait for this process's leading replica: see the class docstring
            with self._agreement:
                self._agreement.wait_for(lambda: self._agreed_here >= batches)
        stop = self._values[3] if several_hosts else self._values[1]
        return int(self._values[2]) if stop and batches >= stop else None

    def _agree(self, hosts: WorkerGroup) -> None:
        """The maximum over the worker processes of (signal, batches started, agreed batch); sets the agreed batch."""
        import torch

        requested = self._values[2] if self._values[1] else 0
        mine = torch.tensor([requested, self._values[0], self._values[3]], dtype=torch.int64)
        signum, started, agreed = (int(value) for value in hosts.maximum(mine).tolist())
        if signum and not self._values[3]:
            self._values[2] = signum
            self._values[3] = agreed or started + STOP_MARGIN_BATCHES


#: The agreement of the spawn strategy's replicas on this host (``None`` outside a spawn launch).
host_stop: Optional[HostStop] = None


@contextlib.contextmanager
def workers_stop_together(context: Any, ends_unless_read: bool = False) -> Iterator[None]:
    """While the spawn strategy's workers run: the stop signals make every replica stop after one agreed batch.

    The main process's handlers, installed here, are inherited by the forked workers, so a signal to
    the main process or to any worker makes the same request (:class:`HostStop`).

    Args:
        context: the ``multiprocessing`` context the workers are started with.
        ends_unless_read: Fabric's launcher: a signal ends the run (after the writes in flight) unless the
            replicas read the stop flag (see :meth:`HostStop.request`).

    Raises:
        ValueError: ``XLA_PLUGINS_CHECKPOINT_SIGNALS`` or ``XLA_PLUGINS_CHECKPOINT_DEADLINE`` is invalid.
    """
    global host_stop
    signals = checkpoint_signals()
    deadline_s()
    outer, host_stop = host_stop, HostStop(context, ends_unless_read)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {signum: signal.signal(signum, host_stop.request) for signum in signals}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        host_stop = outer
