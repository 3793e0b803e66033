"""The XLA cluster environment: world size and ranks as the torch_xla runtime reports them.

Under torchrun (Lightning's ``TorchElasticEnvironment.detect()``) the launcher owns the processes:
:func:`process_environment` then gives torchrun's environment instead, and
:func:`check_launcher_world` holds torchrun's world against the one torch_xla's runtime formed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Optional

from lightning.fabric.plugins.environments import ClusterEnvironment, TorchElasticEnvironment
from lightning.fabric.plugins.environments.xla import XLAEnvironment as _LightningXLAEnvironment
from typing_extensions import override

from trainer_plugins import _variables
from xla_plugins.runtime import _probes
from xla_plugins.runtime._world import RuntimeFigures, World, one_replica_per_device

log = logging.getLogger(__name__)


class XLAEnvironment(_LightningXLAEnvironment):
    """Cluster environment of XLA runs, read from ``torch_xla.runtime`` (torch_xla >= 2.1 names).

    Values are read on every call rather than cached: under PJRT, devices of one process run as
    threads, each with its own ordinal. Lightning cannot set the world size or ranks here; such
    calls are ignored with a debug message, as in Lightning.

    Raises:
        ModuleNotFoundError: torch_xla is not installed.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _probes.require_torch_xla()
        super().__init__(*args, **kwargs)

    @staticmethod
    @override
    def detect() -> bool:
        """Whether torch_xla is installed and its PJRT device is usable."""
        return _probes.devices_usable()

    def world(self) -> World:
        """This replica's :class:`~xla_plugins.runtime._world.World` (one replica per device).

        From :func:`~xla_plugins.runtime._world.one_replica_per_device` over the runtime's
        figures (:func:`~xla_plugins.runtime._probes.runtime_figures`).
        """
        return one_replica_per_device(_probes.runtime_figures())

    @override
    def world_size(self) -> int:  # type: ignore[override]  # Lightning's is cached
        """Replicas across all hosts: the slice's devices (``torch_xla.runtime.global_runtime_device_count()``)."""
        return self.world().world_size

    @override
    def global_rank(self) -> int:  # type: ignore[override]  # Lightning's is cached
        """Replica index across all hosts: ``torch_xla.runtime.global_ordinal()``."""
        return self.world().global_rank

    @override
    def local_rank(self) -> int:  # type: ignore[override]  # Lightning's is cached
        """Replica index on this host: ``torch_xla.runtime.local_ordinal()``."""
        return self.world().local_rank

    @override
    def node_rank(self) -> int:  # type: ignore[override]  # Lightning's is cached
        """Index of this host: ``process_index() // local_process_count()`` (the TPU worker id)."""
        return self.world().node_rank


def started_by_torchrun() -> bool:
    """Whether torchrun started this process (Lightning's ``TorchElasticEnvironment.detect()``)."""
    return bool(TorchElasticEnvironment.detect())


def process_environment() -> ClusterEnvironment:
    """The cluster environment of an XLA run: Lightning's ``TorchElasticEnvironment`` under torchrun, else
    :class:`XLAEnvironment`.

    Under torchrun the processes exist already (``creates_processes_externally``): world size and
    ranks are torchrun's (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``GROUP_RANK``), as torch_xla's
    own ``torch_xla.launch`` runs the function in place under torchrun instead of spawning.
    """
    return TorchElasticEnvironment() if started_by_torchrun() else XLAEnvironment()


def check_launcher_world(world_of: Callable[[RuntimeFigures], World], unit: str) -> None:
    """Under torchrun: refuse a torchrun world other than the one torch_xla's runtime formed.

    torch_xla's ``xla://`` rendezvous numbers the ranks of its process group by the runtime
    (``global_ordinal``/``world_size``, or ``process_index``/``process_count`` under SPMD), while
    Lightning takes them from torchrun; both must name the same world, or data shares and rank 0's
    duties would go to other processes than XLA's collectives expect. Outside torchrun: nothing.

    Args:
        world_of: the world model of the strategy (:mod:`xla_plugins.runtime._world`), applied to the
            runtime's figures (:func:`~xla_plugins.runtime._probes.runtime_figures`).
        unit: what one rank is, for the message (``"device"``, ``"host"``).

    Raises:
        RuntimeError: torchrun's ``WORLD_SIZE``/``RANK`` differ from the runtime's world size and
            rank, or the runtime's figures form no world; the message names both (on PJRT CPU
            several processes never form one XLA world).
    """
    if not started_by_torchrun():
        return
    launcher = TorchElasticEnvironment()
    size, rank = launcher.world_size(), launcher.global_rank()
    hint = (
        f" Start one torchrun process per {unit} on every host, with a static rendezvous whose --node_rank is"
        " the host's TPU worker id. (On PJRT CPU, processes never form one XLA world: each is a world of its own.)"
    )
    told = f"torchrun gave this process WORLD_SIZE={size} and RANK={rank}"
    try:
        runtime = world_of(_probes.runtime_figures())
    except ValueError as error:
        raise RuntimeError(f"{told}, but torch_xla's runtime formed no such world: {error}{hint}") from error
    if (size, rank) != (runtime.world_size, runtime.global_rank):
        raise RuntimeError(
            f"{told}, but torch_xla's runtime formed a world of {runtime.world_size} (one rank per {unit}) with"
            f" this process as rank {runtime.global_rank}.{hint}"
        )


def launcher_local_world_size() -> Optional[int]:
    """torchrun's processes on this host (``LOCAL_WORLD_SIZE``), or ``None`` where torchrun did not start this one.

    Raises:
        ValueError: ``LOCAL_WORLD_SIZE`` is not an integer >= 1 (the message names the value).
    """
    if not started_by_torchrun():
        return None
    return _variables.process_count_from_environment("LOCAL_WORLD_SIZE", 1)


def check_one_process_per_host() -> None:
    """Under torchrun: refuse more than one process per host for the SPMD strategies (one drives every device).

    Raises:
        ValueError: torchrun's ``LOCAL_WORLD_SIZE`` is not 1; the message names it and the flag to pass.
    """
    local = launcher_local_world_size()
    if local is not None and local != 1:
        raise ValueError(
            f"The SPMD strategies run one process per host, but torchrun started LOCAL_WORLD_SIZE={local}"
            " on this host. Start them with `torchrun --nproc_per_node=1` on every host."
        )
