"""Cluster environments read from the variables that TPU VMs and schedulers give each host.

On a GKE pod, a Cloud TPU VM, a Kubernetes Indexed Job or a SkyPilot cluster started without
torchrun, Lightning has no environment that knows the host's place: every host runs with
``LightningEnvironment`` and believes it is node 0. The environments here read the host's node
rank, the node count, the main address and (multislice) the slice from those variables, and, like
``LightningEnvironment``, let Lightning's launcher start the processes of each host.

=================================  ===============================================================
environment                        variables (where they come from)
=================================  ===============================================================
:class:`TPUVMEnvironment`          ``TPU_WORKER_ID``, ``TPU_WORKER_HOSTNAMES`` (comma-separated;
                                   GKE's TPU webhook, Cloud TPU VMs; torch_xla's
                                   ``_internal/tpu.py`` reads the same two), with
                                   ``MEGASCALE_NUM_SLICES``, ``MEGASCALE_SLICE_ID``,
                                   ``MEGASCALE_COORDINATOR_ADDRESS`` for several slices (multislice)
:class:`IndexedJobEnvironment`     ``JOB_COMPLETION_INDEX`` (Kubernetes Indexed Jobs, JobSet); main
                                   address ``MASTER_ADDR``, else pod ``<job>-0`` of the job's
                                   headless service (``HOSTNAME`` is ``<job>-<index>``)
:class:`SkyPilotEnvironment`       ``SKYPILOT_NODE_RANK``, ``SKYPILOT_NODE_IPS`` (one address a
                                   line, the head node first), ``SKYPILOT_NUM_NODES``
=================================  ===============================================================

The port is ``MASTER_PORT`` when set, else :data:`DEFAULT_MAIN_PORT` (torchrun's default): every
host must name the same port, so none is picked at random as ``LightningEnvironment`` does on one
host. Partial or contradictory variables raise ``ValueError`` naming them and their values, never a
silent node 0; where several schedulers' variables are set, they must agree on the host's index in
its job (``TPU_WORKER_ID``, ``JOB_COMPLETION_INDEX``, ``SKYPILOT_NODE_RANK``).

The connector (:meth:`trainer_plugins.Connector.choose_environment`) asks these in the order of
``trainer_plugins._builtin.HOST_ENVIRONMENTS``, after the accelerator's plugin's own environment
(where it has one) and Lightning's launchers (:func:`launcher_variables`). Backend-free: nothing
here imports a device runtime.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Optional

from lightning.fabric.plugins.environments import (
    ClusterEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)
from lightning.fabric.utilities.rank_zero import rank_zero_only

#: The port when ``MASTER_PORT`` is unset: torchrun's default ``--master-port``.
DEFAULT_MAIN_PORT = 29500

#: Variables of the launchers Lightning reads itself (its ``LightningEnvironment`` and
#: ``KubeflowEnvironment``): any of them set means Lightning's own environments decide.
LIGHTNING_VARIABLES = ("LOCAL_RANK", "NODE_RANK", "GROUP_RANK")
KUBEFLOW_VARIABLES = ("MASTER_ADDR", "WORLD_SIZE", "RANK")

TPU_VM_VARIABLES = ("TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES")
MULTISLICE_VARIABLES = ("MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID", "MEGASCALE_COORDINATOR_ADDRESS")
INDEXED_JOB_VARIABLES = ("JOB_COMPLETION_INDEX",)
SKYPILOT_VARIABLES = ("SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS", "SKYPILOT_NUM_NODES")


@dataclass(frozen=True)
class HostLayout:
    """Where this host sits in a job, as one scheduler's variables say.

    Attributes:
        node_rank: this host's index among all hosts, ``0 <= node_rank < num_nodes``.
        num_nodes: the number of hosts, or ``None`` where the scheduler does not say (an Indexed
            Job: the Trainer's ``num_nodes`` counts).
        main_address: host name or IP address of node 0, or ``None`` where the variables do not say.
        index_in_job: this host's index in its scheduler's job (``TPU_WORKER_ID``,
            ``JOB_COMPLETION_INDEX``, ``SKYPILOT_NODE_RANK``): what schedulers must agree on.
        slice_id: the TPU slice of this host (0 without multislice).
        num_slices: the number of slices (1 without multislice).
        variables: the variables read, name -> value, in the order read.
        missing: why ``main_address`` is ``None`` and how to give it (an error message).
    """

    node_rank: int
    num_nodes: Optional[int]
    main_address: Optional[str]
    index_in_job: int
    slice_id: int = 0
    num_slices: int = 1
    variables: Mapping[str, str] = field(default_factory=dict)
    missing: str = ""

    def describe(self) -> str:
        """The variables read and what they gave, for :func:`trainer_plugins.explain`."""
        read = ", ".join(f"{name}={value!r}" for name, value in self.variables.items())
        count = f" of {self.num_nodes}" if self.num_nodes is not None else ""
        slices = f", slice {self.slice_id} of {self.num_slices}" if self.num_slices > 1 else ""
        address = self.main_address or "unknown"
        return f"read {read}: node_rank {self.node_rank}{count}, main address {address}{slices}"


def _present(environ: Mapping[str, str], names: tuple[str, ...]) -> dict[str, str]:
    return {name: environ[name] for name in names if name in environ}


def _integer(variables: Mapping[str, str], name: str, minimum: int = 0) -> int:
    value = variables[name]
    try:
        number = int(value)
    except ValueError:
        number = minimum - 1
    if number < minimum:
        raise ValueError(f"{name}={value!r} is not an integer >= {minimum}.")
    return number


def _require(scheduler: str, variables: Mapping[str, str], names: tuple[str, ...], why: str) -> None:
    missing = [name for name in names if name not in variables]
    if missing:
        given = ", ".join(f"{name}={value!r}" for name, value in variables.items())
        raise ValueError(
            f"{scheduler} variables are incomplete: {given} is set but {', '.join(missing)} is not ({why})."
            f" Set {' and '.join(missing)} on every host, or unset {', '.join(variables)}."
        )


def read_tpu_vm(environ: Mapping[str, str]) -> Optional[HostLayout]:
    """The layout that a TPU VM's variables (and multislice's) give, or ``None`` when none is set.

    ``TPU_WORKER_HOSTNAMES`` lists the hosts of this host's slice, in worker order (the rule
    torch_xla's ``_internal/tpu.py`` uses); ``TPU_WORKER_ID`` indexes it. Multislice (the three
    ``MEGASCALE_*`` variables, set together by XPK and Ray's TPU support) numbers the hosts slice by
    slice: node rank ``MEGASCALE_SLICE_ID * hosts_per_slice + TPU_WORKER_ID``, node 0 at
    ``MEGASCALE_COORDINATOR_ADDRESS`` (the first host of slice 0; a ``:port`` on it is Megascale's
    own and dropped). Without ``TPU_WORKER_*`` each slice is one host.

    Raises:
        ValueError: one of ``TPU_WORKER_ID``/``TPU_WORKER_HOSTNAMES`` without the other; a worker id
            out of the host list's range; multislice variables incomplete or a slice id out of range.
    """
    worker = _present(environ, TPU_VM_VARIABLES)
    slices = _present(environ, MULTISLICE_VARIABLES)
    if not worker and not slices:
        return None
    hosts: list[str] = []
    worker_id = 0
    if worker:
        _require("TPU VM", worker, TPU_VM_VARIABLES, "the worker id indexes the host names")
        hosts = [host.strip() for host in worker["TPU_WORKER_HOSTNAMES"].split(",")]
        if not all(hosts):
            raise ValueError(f"TPU_WORKER_HOSTNAMES={worker['TPU_WORKER_HOSTNAMES']!r} has an empty host name.")
        worker_id = _integer(worker, "TPU_WORKER_ID")
        if worker_id >= len(hosts):
            raise ValueError(
                f"TPU_WORKER_ID={worker['TPU_WORKER_ID']!r} is out of range of"
                f" TPU_WORKER_HOSTNAMES={worker['TPU_WORKER_HOSTNAMES']!r}, which names {len(hosts)} host(s):"
                f" valid worker ids are 0 to {len(hosts) - 1}."
            )
    hosts_per_slice = max(len(hosts), 1)
    num_slices = slice_id = 0
    if slices:
        _require("Multislice", slices, MULTISLICE_VARIABLES, "the slices' hosts meet at node 0's address")
        num_slices = _integer(slices, "MEGASCALE_NUM_SLICES", minimum=1)
        slice_id = _integer(slices, "MEGASCALE_SLICE_ID")
    num_slices = max(num_slices, 1)
    if slice_id >= num_slices:
        raise ValueError(
            f"MEGASCALE_SLICE_ID={slices['MEGASCALE_SLICE_ID']!r} is out of range of"
            f" MEGASCALE_NUM_SLICES={slices['MEGASCALE_NUM_SLICES']!r}: valid slice ids are 0 to {num_slices - 1}."
        )
    if slices:
        coordinator = slices["MEGASCALE_COORDINATOR_ADDRESS"]
        main_address = coordinator.rsplit(":", 1)[0] if coordinator.count(":") == 1 else coordinator
    else:
        main_address = hosts[0]
    return HostLayout(
        node_rank=slice_id * hosts_per_slice + worker_id,
        num_nodes=num_slices * hosts_per_slice,
        main_address=main_address,
        index_in_job=worker_id,
        slice_id=slice_id,
        num_slices=num_slices,
        variables={**worker, **slices},
    )


def _headless_service_domain(hostname: str) -> Optional[str]:
    """The domain after ``hostname`` in this pod's fully qualified name (its headless service), or ``None``.

    Kubernetes writes ``<hostname>.<subdomain>.<namespace>.svc.<cluster domain>`` into a pod's
    ``/etc/hosts`` when the pod template names a ``subdomain`` (the Job's headless service).
    """
    fqdn = socket.getfqdn(hostname)
    prefix = hostname + "."
    return fqdn[len(prefix) :] if fqdn.startswith(prefix) and len(fqdn) > len(prefix) else None


def read_indexed_job(
    environ: Mapping[str, str], domain_of: Callable[[str], Optional[str]] = _headless_service_domain
) -> Optional[HostLayout]:
    """The layout that a Kubernetes Indexed Job's variables give, or ``None`` when ``JOB_COMPLETION_INDEX`` is unset.

    Kubernetes sets ``JOB_COMPLETION_INDEX`` (0 to ``completions - 1``) and the pod host name
    ``<job name>-<index>`` (``HOSTNAME``); the node count is not given (the Trainer's ``num_nodes``
    counts). Node 0's address is ``MASTER_ADDR`` when set, else ``<job name>-0.<domain>`` where the
    pod template's ``subdomain`` (the job's headless service) gives the pod a domain.

    Args:
        environ: the variables.
        domain_of: host name -> the pod's domain under its headless service, or ``None``.

    Returns:
        The layout; its ``main_address`` is ``None`` (``missing`` says why) when neither
        ``MASTER_ADDR`` nor a host name ``<job>-<index>`` under a headless service gives it (on GKE's
        TPU pods ``TPU_WORKER_HOSTNAMES`` does; :class:`IndexedJobEnvironment` raises).

    Raises:
        ValueError: the index is not an integer.
    """
    job = _present(environ, INDEXED_JOB_VARIABLES)
    if not job:
        return None
    index = _integer(job, "JOB_COMPLETION_INDEX")
    variables = dict(job)
    main_address: Optional[str] = environ.get("MASTER_ADDR")
    missing = ""
    if main_address is not None:
        variables["MASTER_ADDR"] = main_address
    else:
        variables["HOSTNAME"] = hostname = environ.get("HOSTNAME", "")
        suffix = f"-{index}"
        domain = domain_of(hostname) if hostname.endswith(suffix) else None
        if domain is not None:
            main_address = f"{hostname[: -len(suffix)]}-0.{domain}"
        else:
            missing = (
                f"JOB_COMPLETION_INDEX={job['JOB_COMPLETION_INDEX']!r} gives the node rank but not node 0's address:"
                f" HOSTNAME={hostname!r} is not '<job name>{suffix}' under a headless service. Set MASTER_ADDR"
                " to index 0's pod (e.g. '<job name>-0.<headless service>'), or give the pod template"
                " `subdomain: <headless service>`."
            )
    return HostLayout(
        node_rank=index,
        num_nodes=None,
        main_address=main_address,
        index_in_job=index,
        variables=variables,
        missing=missing,
    )


def read_skypilot(environ: Mapping[str, str]) -> Optional[HostLayout]:
    """The layout that SkyPilot's variables give, or ``None`` when none is set.

    SkyPilot sets ``SKYPILOT_NODE_RANK``, ``SKYPILOT_NODE_IPS`` (one address a line, the head node,
    rank 0, first) and ``SKYPILOT_NUM_NODES`` on every node of a task.

    Raises:
        ValueError: one of them without the others; the rank out of range of the addresses; a node
            count other than the number of addresses.
    """
    sky = _present(environ, SKYPILOT_VARIABLES)
    if not sky:
        return None
    _require("SkyPilot", sky, SKYPILOT_VARIABLES, "the node rank indexes the node addresses")
    addresses = [line.strip() for line in sky["SKYPILOT_NODE_IPS"].splitlines() if line.strip()]
    rank = _integer(sky, "SKYPILOT_NODE_RANK")
    num_nodes = _integer(sky, "SKYPILOT_NUM_NODES", minimum=1)
    if num_nodes != len(addresses) or rank >= num_nodes:
        raise ValueError(
            f"SkyPilot variables contradict each other: SKYPILOT_NODE_RANK={sky['SKYPILOT_NODE_RANK']!r},"
            f" SKYPILOT_NUM_NODES={sky['SKYPILOT_NUM_NODES']!r}, SKYPILOT_NODE_IPS={sky['SKYPILOT_NODE_IPS']!r}"
            f" ({len(addresses)} address(es)): the rank must be below the node count, which must equal the"
            " number of addresses."
        )
    return HostLayout(node_rank=rank, num_nodes=num_nodes, main_address=addresses[0], index_in_job=rank, variables=sky)


def launcher_variables() -> Optional[str]:
    """Which of Lightning's own launchers' environments applies here, or ``None``.

    Lightning's order (its connectors' ``_choose_and_init_cluster_environment``): torchrun
    (``TorchElasticEnvironment``), SLURM, LSF, MPI, each by its ``detect()``; then the variables
    ``LightningEnvironment`` reads (``LOCAL_RANK``, ``NODE_RANK``, ``GROUP_RANK``: Lightning's own
    launcher sets them in the processes it starts), then those ``KubeflowEnvironment`` reads
    (``MASTER_ADDR``, ``WORLD_SIZE`` and ``RANK``, all three). Where one applies, the host
    environments stand aside.

    Returns:
        The environment's name (``"torchelastic"``, ``"slurm"``, ``"lsf"``, ``"mpi"``, ``"lightning"``,
        ``"kubeflow"``), or ``None``.
    """
    for name, cls in (
        ("torchelastic", TorchElasticEnvironment),
        ("slurm", SLURMEnvironment),
        ("lsf", LSFEnvironment),
        ("mpi", MPIEnvironment),
    ):
        if cls.detect():
            return name
    if any(name in os.environ for name in LIGHTNING_VARIABLES):
        return "lightning"
    if all(name in os.environ for name in KUBEFLOW_VARIABLES):
        return "kubeflow"
    return None


#: Readers of every scheduler, in the connector's order; the environments below use them.
READERS: dict[str, Callable[[Mapping[str, str]], Optional[HostLayout]]] = {
    "tpu_vm": read_tpu_vm,
    "indexed_job": read_indexed_job,
    "skypilot": read_skypilot,
}


def read_hosts(environ: Mapping[str, str]) -> dict[str, HostLayout]:
    """Every scheduler's layout (name as in :data:`READERS` -> layout), once they agree.

    Raises:
        ValueError: a reader's error; or two schedulers disagree on the host's index in its job
            (``TPU_WORKER_ID``, ``JOB_COMPLETION_INDEX``, ``SKYPILOT_NODE_RANK``); the message names
            both variables and values.
    """
    layouts = {name: layout for name, reader in READERS.items() if (layout := reader(environ)) is not None}
    first_name, *others = layouts or [""]
    for other in others:
        first, second = layouts[first_name], layouts[other]
        if first.index_in_job != second.index_in_job:
            raise ValueError(
                f"The schedulers disagree on this host's index: {first.describe()} ({first_name}), but"
                f" {second.describe()} ({other}). Unset the variables of the scheduler that did not start this job."
            )
    return layouts


class HostEnvironment(ClusterEnvironment):
    """A cluster environment whose node rank, node count and main address come from one scheduler's variables.

    Lightning's launcher starts each host's processes (``creates_processes_externally`` is ``False``
    until ``LOCAL_RANK`` is set, as for ``LightningEnvironment``); the strategy sets world size and
    global rank (``node_rank * devices + local_rank``). Subclasses name their reader.

    Raises:
        ValueError: (constructor) the variables are partial or contradict each other, or another
            scheduler's variables disagree (:func:`read_hosts`); the message names them.
    """

    scheduler: ClassVar[str]

    def __init__(self) -> None:
        super().__init__()
        layout = read_hosts(os.environ).get(self.scheduler)
        if layout is None:
            names = ", ".join(_variables_of(self.scheduler))
            raise ValueError(f"{type(self).__name__} needs its variables ({names}); none is set.")
        if layout.main_address is None:
            raise ValueError(layout.missing)
        self.layout = layout
        self._main_address: str = layout.main_address
        self._main_port = int(os.environ.get("MASTER_PORT", DEFAULT_MAIN_PORT))
        self._global_rank = 0
        self._world_size = 1

    def describe(self) -> str:
        """The variables read, what they gave, the port and its source (:func:`trainer_plugins.explain` shows it)."""
        source = "MASTER_PORT" if "MASTER_PORT" in os.environ else "default"
        return f"{self.layout.describe()}, port {self.main_port} ({source})"

    @classmethod
    def detect(cls) -> bool:
        """Whether any of this scheduler's variables is set (partial ones too: building the environment names them)."""
        return any(name in os.environ for name in _variables_of(cls.scheduler))

    @property
    def creates_processes_externally(self) -> bool:
        return "LOCAL_RANK" in os.environ

    @property
    def main_address(self) -> str:
        return self._main_address

    @property
    def main_port(self) -> int:
        return self._main_port

    def world_size(self) -> int:
        return self._world_size

    def set_world_size(self, size: int) -> None:
        self._world_size = size

    def global_rank(self) -> int:
        return self._global_rank

    def set_global_rank(self, rank: int) -> None:
        self._global_rank = rank
        rank_zero_only.rank = rank  # type: ignore[attr-defined]  # as LightningEnvironment sets it

    def local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", 0))

    def node_rank(self) -> int:
        return self.layout.node_rank

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Check the Trainer's ``num_nodes`` against the scheduler's.

        Raises:
            ValueError: the scheduler counts another number of hosts, or this host's rank is not
                below ``num_nodes``; the message names the variables.
        """
        layout = self.layout
        if (layout.num_nodes is not None and layout.num_nodes != num_nodes) or layout.node_rank >= num_nodes:
            raise ValueError(
                f"`num_nodes={num_nodes}` does not fit {type(self).__name__}, which {layout.describe()}."
                f" Pass `num_nodes={layout.num_nodes or layout.node_rank + 1}` or more as the job has hosts."
            )

    def teardown(self) -> None:
        os.environ.pop("WORLD_SIZE", None)  # set by Lightning's launcher, as LightningEnvironment removes it


def _variables_of(scheduler: str) -> tuple[str, ...]:
    return {
        "tpu_vm": TPU_VM_VARIABLES + MULTISLICE_VARIABLES,
        "indexed_job": INDEXED_JOB_VARIABLES,
        "skypilot": SKYPILOT_VARIABLES,
    }[scheduler]


class TPUVMEnvironment(HostEnvironment):
    """Hosts of TPU slices: ``TPU_WORKER_ID``/``TPU_WORKER_HOSTNAMES`` and ``MEGASCALE_*`` (:func:`read_tpu_vm`)."""

    scheduler = "tpu_vm"

    @property
    def slice_id(self) -> int:
        """This host's slice (``MEGASCALE_SLICE_ID``, 0 without multislice)."""
        return self.layout.slice_id


class IndexedJobEnvironment(HostEnvironment):
    """Pods of a Kubernetes Indexed Job: ``JOB_COMPLETION_INDEX`` (:func:`read_indexed_job`)."""

    scheduler = "indexed_job"


class SkyPilotEnvironment(HostEnvironment):
    """Nodes of a SkyPilot cluster: ``SKYPILOT_NODE_RANK``/``_NODE_IPS``/``_NUM_NODES`` (:func:`read_skypilot`)."""

    scheduler = "skypilot"
