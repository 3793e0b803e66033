"""The job-wide variables TorchTPU's workers need before they start (the pre-start environment role).

Every worker of a TorchTPU job must see the same ``TORCH_TPU_SLICEBUILDER_ADDRESSES`` (one ``host:port``
per worker) and ``TORCH_TPU_TOPOLOGY`` (the chip mesh); torchrun and Lightning's launchers set neither.
torch-tpu derives them, with ``NNODES``, ``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` and
``TORCH_TPU_XPROF_SESSION_ID`` on several hosts, in ``torch.tpu.distributed.set_tpu_launch_env``, from
``TPU_WORKER_HOSTNAMES`` and ``JOB_COMPLETION_INDEX``, and never changes a variable already set.

:func:`for_run` answers the hook: torch-tpu's own function where torch-tpu is installed
(:func:`from_torch_tpu`), else :func:`derive`, the same rule in our code (checked against torch-tpu
0.2.0 in tests/test_torchtpu_probes.py). Nothing here starts a TPU device. Not verified on TPU.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Optional

from torchtpu_plugins import _autoload
from torchtpu_plugins.runtime import _pci
from torchtpu_plugins.runtime._probes import torch_tpu_installed

SLICEBUILDER = "TORCH_TPU_SLICEBUILDER_ADDRESSES"
TOPOLOGY = "TORCH_TPU_TOPOLOGY"
XPROF = "TORCH_TPU_XPROF_SESSION_ID"
#: Every variable ``set_tpu_launch_env`` (torch-tpu 0.2.0) may set.
LAUNCH_VARIABLES = (XPROF, SLICEBUILDER, "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", TOPOLOGY)
#: What a worker started by an outside launcher takes from here: the engine owns the ranks and the
#: rendezvous, and a profiling session id made from the clock would differ between workers.
WORKER_VARIABLES = (SLICEBUILDER, TOPOLOGY)
#: torch-tpu 0.2.0's defaults: first slice-builder port, devices per host when nothing says, rendezvous port.
BASE_PORT, DEVICES_PER_HOST, MASTER_PORT = 8070, 8, "29500"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


def _hosts(environ: Mapping[str, str]) -> list[str]:
    return [host for host in environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if host]


def multihost(environ: Mapping[str, str], nnodes: Optional[int]) -> bool:
    """torch-tpu's test: ``nnodes > 1``, two or more ``TPU_WORKER_HOSTNAMES``, or ``JOB_COMPLETION_INDEX`` set."""
    return (nnodes is not None and nnodes > 1) or len(_hosts(environ)) > 1 or "JOB_COMPLETION_INDEX" in environ


def derive(
    environ: Mapping[str, str],
    nnodes: Optional[int],
    nproc_per_node: Optional[int],
    chips: list[str],
    pick_port: Callable[[], int] = _free_port,
) -> dict[str, str]:
    """The variables ``set_tpu_launch_env(nnodes=, nproc_per_node=)`` of torch-tpu 0.2.0 would set, from ``environ``.

    Only unset variables are derived (one set to ``""`` counts as set). On several hosts the
    addresses are ``<host>:<TORCH_TPU_BASE_PORT + i>`` for each of ``TPU_WORKER_HOSTNAMES`` and
    ``i < TORCH_TPU_DEVICES_PER_HOST`` (default ``nproc_per_node``, else the chips here, else 8),
    ``NODE_RANK`` is ``JOB_COMPLETION_INDEX`` and ``MASTER_ADDR`` the first host; on one host, one
    ``localhost:<unused port>`` per process and the topology of that many chips. torch-tpu ranks hosts
    by their chips' coordinates where ``TORCH_TPU_TOPOLOGY`` is given and a chip is attached (a device
    query this code does not make); here ``JOB_COMPLETION_INDEX`` always decides.

    Args:
        environ: the variables as they are (``os.environ``); never changed.
        nnodes: hosts of the job, or ``None`` (from ``TPU_WORKER_HOSTNAMES``).
        nproc_per_node: processes on each host, or ``None`` (the chips here).
        chips: the TPU chips on this host (:func:`torchtpu_plugins.runtime._pci.tpu_chips`).
        pick_port: gives an unused local TCP port (single host).

    Raises:
        ValueError: ``nnodes`` disagrees with ``TPU_WORKER_HOSTNAMES``; several hosts but an unset
            variable needs ``TPU_WORKER_HOSTNAMES`` or ``JOB_COMPLETION_INDEX`` and it is unset; one
            host and no TPU chip to take the topology from (set ``TORCH_TPU_TOPOLOGY``).
    """
    found: dict[str, str] = {}

    def put(name: str, value: Callable[[], str]) -> None:
        if name not in environ:
            found[name] = value()

    put(XPROF, lambda: str(time.time_ns()))
    hosts = _hosts(environ)
    if nnodes is not None and hosts and nnodes != len(hosts):
        raise ValueError(
            f"{nnodes} hosts asked for (num_nodes), but TPU_WORKER_HOSTNAMES names {len(hosts)}:"
            f" {environ['TPU_WORKER_HOSTNAMES']!r}"
        )
    if not multihost(environ, nnodes):
        count = nproc_per_node if nproc_per_node is not None else len(chips)
        topology = _pci.host_topology(chips, nproc_per_node)
        put(SLICEBUILDER, lambda: ",".join(f"localhost:{pick_port()}" for _ in range(count)))
        if topology is None and TOPOLOGY not in environ:
            raise ValueError(f"no TPU chip on this host to take {TOPOLOGY} from: set it (e.g. '2,2,1')")
        put(TOPOLOGY, lambda: str(topology))
        return found

    def need_hosts() -> list[str]:
        if not hosts:
            raise ValueError("several TPU hosts, but TPU_WORKER_HOSTNAMES (a comma-separated list of hosts) is unset")
        return hosts

    def addresses() -> str:
        base = int(environ.get("TORCH_TPU_BASE_PORT", BASE_PORT))
        per_host = int(environ.get("TORCH_TPU_DEVICES_PER_HOST", nproc_per_node or len(chips) or DEVICES_PER_HOST))
        return ",".join(f"{host}:{base + i}" for host in need_hosts() for i in range(per_host))

    def node_rank() -> str:
        if "JOB_COMPLETION_INDEX" not in environ:
            raise ValueError("NODE_RANK is unset and JOB_COMPLETION_INDEX (this host's 0-based index) too: set one")
        return str(int(environ["JOB_COMPLETION_INDEX"]))

    put(SLICEBUILDER, addresses)
    put("NNODES", lambda: str(nnodes if nnodes is not None else len(need_hosts())))
    put("NODE_RANK", node_rank)
    put("MASTER_ADDR", lambda: need_hosts()[0])
    put("MASTER_PORT", lambda: MASTER_PORT)
    topology = _pci.host_topology(chips)
    if topology is not None:
        put(TOPOLOGY, lambda: topology)
    return found


def _restore(before: Mapping[str, str]) -> None:
    for name in set(os.environ) - set(before):
        del os.environ[name]
    for name, value in before.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


def from_torch_tpu(nnodes: Optional[int], nproc_per_node: Optional[int]) -> dict[str, str]:
    """What torch-tpu's own ``torch.tpu.distributed.set_tpu_launch_env`` sets here; ``os.environ`` is left as it was.

    Imports torch and torch_tpu (with a TPU attached, torch's backend autoload has loaded it already);
    neither the call nor the import starts the device of this process.

    Raises:
        ValueError: torch-tpu's own refusal of the layout.
    """
    before = dict(os.environ)
    try:
        import torch_tpu  # noqa: F401  (registers torch.tpu where torch's backend autoload did not)
        from torch.tpu import distributed  # type: ignore[attr-defined]

        _restore(before)  # importing torch_tpu by hand leaves TORCH_DEVICE_BACKEND_AUTOLOAD=0 behind
        distributed.set_tpu_launch_env(nnodes=nnodes, nproc_per_node=nproc_per_node)
        return {name: os.environ[name] for name in LAUNCH_VARIABLES if name not in before and name in os.environ}
    finally:
        _restore(before)


def for_run(num_nodes: int, processes_per_node: int, started_externally: bool) -> dict[str, str]:
    """The variables this run's workers need that are unset here (the hook's answer); nothing is changed.

    Our launcher (``started_externally`` false) derives every variable in the process that starts the
    workers. A worker an outside launcher started derives only :data:`WORKER_VARIABLES`, and only where
    every worker comes to the same value: on one host the addresses name ports picked at random, so
    there they must be set before the launcher starts (torch-tpu's ``python -m torch.tpu.distributed``
    prints them). The stand-in device needs none.

    Raises:
        ValueError: the layout cannot be derived (the message names what to set).
    """
    if os.environ.get(_autoload.VARIABLE):
        return {}
    nnodes = None if started_externally else num_nodes
    if (
        started_externally
        and processes_per_node > 1
        and SLICEBUILDER not in os.environ
        and not multihost(os.environ, None)
    ):
        raise ValueError(
            f"these {processes_per_node} TorchTPU workers on one host were started by an outside launcher without"
            f" {SLICEBUILDER}: each would pick other ports. Set it (and {TOPOLOGY}) before starting the launcher,"
            " for example from what `python -m torch.tpu.distributed` prints"
        )
    try:
        if torch_tpu_installed():
            variables = from_torch_tpu(nnodes, processes_per_node)
        else:
            variables = derive(os.environ, nnodes, processes_per_node, _pci.tpu_chips())
    except (ValueError, RuntimeError) as error:
        raise ValueError(f"TorchTPU's launch environment cannot be derived: {error}") from error
    if started_externally:
        return {name: value for name, value in variables.items() if name in WORKER_VARIABLES}
    return variables
