"""Launchers of the multi-device XLA strategy: one worker per device, all stopped on the first failure.

Laid out as Lightning's ``strategies/launchers/``, each module importing only those below it:

* :mod:`~xla_plugins.strategies.launchers.xla`: the launchers of ``lightning.Trainer`` and
  ``lightning.Fabric`` (:class:`XLALauncher`, :class:`FabricXLALauncher`);
* ``_supervisor``: starts the worker processes (:func:`spawn_replicas`) and stops them all on the
  first failure;
* ``_watchdog``: the replicas' progress stamps and the replica watch (:func:`progress`,
  :class:`ReportsProgress`, :func:`replica_timeout`);
* ``_failures``: the errors of a replica and how they reach the main process (:func:`run_replica`).

Both launchers start their workers with :func:`spawn_replicas` and run each replica inside
:func:`run_replica`:

* workers are started with the ``fork`` start method, as Lightning's XLA launchers do (guard the
  entry script with ``if __name__ == "__main__":``), one per local process torch_xla's own
  multiprocessing would start (``torch_xla._internal.pjrt.run_multiprocess``: one per TPU chip, or
  one driving every PJRT CPU device); each worker runs torch_xla's worker start-up and one replica
  thread per device (``pjrt._run_thread_per_device``), exactly as ``xmp.spawn`` does. The launcher
  starts the processes itself so that it knows each worker's ranks and exit status; no helper
  process (no ``multiprocessing.Manager``) is involved;
* **a replica that raises** reports its exception and traceback to the main process and ends its
  worker process at once, its other device threads included; the other workers are then killed,
  and the main process raises the replica's exception with the worker traceback chained as
  ``__cause__`` (a :class:`WorkerTraceback`);
* **a worker that dies** without reporting (``os._exit``, a signal such as ``SIGKILL`` from the
  out-of-memory killer, a crash in native code) is reported as :class:`WorkerDiedError`, naming its
  process id, the ranks it ran and its exit code or signal;
* **a replica that hangs** (no batch, optimizer step or collective for
  :data:`REPLICA_TIMEOUT_VARIABLE` seconds, 30 minutes by default) is reported as
  :class:`ReplicaHangError` with its rank and where it is stuck;
* **workers never outlive the main process**: on Linux each worker asks the kernel to kill it when
  the main process ends (``prctl(PR_SET_PDEATHSIG, SIGKILL)``), whatever ends it, ``SIGKILL``
  included; elsewhere a thread of the worker watches its parent. Every worker ends through
  ``os._exit`` in a ``finally`` block, so no exception path returns into the forked copy of the
  main program.
"""

from xla_plugins.strategies.launchers._failures import (
    ReplicaHangError,
    WorkerDiedError,
    WorkerTraceback,
    run_replica,
)
from xla_plugins.strategies.launchers._supervisor import spawn_replicas
from xla_plugins.strategies.launchers._watchdog import (
    DEFAULT_REPLICA_TIMEOUT_S,
    REPLICA_TIMEOUT_VARIABLE,
    ReportsProgress,
    progress,
    replica_timeout,
)
from xla_plugins.strategies.launchers.xla import FabricXLALauncher, XLALauncher

__all__ = [
    "DEFAULT_REPLICA_TIMEOUT_S",
    "REPLICA_TIMEOUT_VARIABLE",
    "FabricXLALauncher",
    "ReplicaHangError",
    "ReportsProgress",
    "WorkerDiedError",
    "WorkerTraceback",
    "XLALauncher",
    "progress",
    "replica_timeout",
    "run_replica",
    "spawn_replicas",
]
