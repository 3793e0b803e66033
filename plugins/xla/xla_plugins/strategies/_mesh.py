"""What the SPMD strategies share: one process drives every device of a mesh (torch_xla's SPMD mode).

:class:`_OneProcessOverAMesh` is the base of both flavours of ``xla_spmd``
(:mod:`xla_plugins.strategies.xla_spmd`) and of the sharded strategies built on it
(:mod:`xla_plugins.strategies.xla_fsdp_v2`): SPMD mode and the mesh, the world of one process per
host, batch meaning and sharding, the host collectives, and where the module is placed.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
from lightning.fabric.utilities.rank_zero import rank_zero_info
from lightning.fabric.utilities.types import ReduceOp
from lightning.pytorch.strategies.strategy import TBroadcast
from lightning_utilities import apply_to_collection
from torch import Tensor
from torch.nn import Module

from xla_plugins.roles.environment import check_launcher_world, check_one_process_per_host
from xla_plugins.runtime import _probes, _world
from xla_plugins.strategies import _batches
from xla_plugins.strategies._hosts import HostGroup
from xla_plugins.strategies._reduce import reduce_op_name
from xla_plugins.strategies._tied_parameters import move_module

#: Name of the mesh axis the batch is sharded over.
DATA_AXIS = "data"


class _OneProcessOverAMesh:
    """What both flavours share: SPMD mode, the mesh, batch meaning and sharding, one-process collectives.

    Constructor arguments are those of Lightning's ``ParallelStrategy`` (keywords), plus ``batch``
    (see :mod:`xla_plugins.strategies._batches`). The strategies built on it choose the default
    checkpoint IO (:mod:`xla_plugins.checkpoints._background_checkpoints`).
    """

    _mesh: Optional[Any] = None
    _hosts: Optional[HostGroup] = None
    #: The strategy's name in start-up log lines.
    _log_name = "xla_spmd"

    def __init__(self, *, batch: str = _batches.PER_DEVICE, checkpoint_io: Optional[Any] = None, **kwargs: Any) -> None:
        _probes.require_torch_xla()
        self.batch = _batches.check_batch_meaning(batch)
        self._described: set[str] = set()
        # None stays None until first used, so that Lightning's connectors take one given through `plugins=[...]`
        super().__init__(checkpoint_io=checkpoint_io, **kwargs)  # type: ignore[call-arg]

    def setup_environment(self) -> None:
        """Enter SPMD mode and build the data mesh, join the other hosts (if any), then start the runtime."""
        self._enter_spmd()
        self._join_hosts()
        super().setup_environment()  # type: ignore[misc]

    @property
    def hosts(self) -> HostGroup:
        """The collectives between the hosts of this run (:class:`~xla_plugins.strategies._hosts.HostGroup`)."""
        if self._hosts is None:
            self._hosts = HostGroup(self.world)
        return self._hosts

    def _join_hosts(self) -> None:
        """On several hosts: join their process group and make only global rank 0 log as rank zero.

        Lightning's DDP sets ``rank_zero_only.rank`` to its global rank the same way. Under torchrun,
        torchrun's world must be the runtime's hosts first (one rank per host).

        Raises:
            RuntimeError: see :meth:`~xla_plugins.strategies._hosts.HostGroup.connect` and
                :func:`~xla_plugins.roles.environment.check_launcher_world`.
        """
        check_launcher_world(_world.one_process_per_host, "host")
        hosts = self.hosts
        if not hosts.several:
            return
        hosts.connect()
        from lightning.fabric.utilities.rank_zero import rank_zero_only
        from lightning_utilities.core.rank_zero import rank_zero_only as utilities_rank_zero_only

        rank_zero_only.rank = utilities_rank_zero_only.rank = hosts.world.global_rank  # type: ignore[attr-defined]

    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        """Run pending graphs on every host, wait for all hosts, then write full CPU tensors on global rank 0.

        Every host must call it (Lightning's ``Trainer.save_checkpoint`` and ``Fabric.save`` are
        called on every rank). Lightning's ``save_checkpoint`` writes on global rank 0 only, through
        ``XLACheckpointIO``, whose copy to CPU would run any still pending graph on rank 0 alone
        (a graph that, under SPMD on several hosts, the other hosts never join); so every host syncs
        first, and rank 0 writes once all have (:meth:`barrier`).
        """
        import torch_xla

        torch_xla.sync()
        self.barrier("xla_plugins.save_checkpoint")
        super().save_checkpoint(*args, **kwargs)  # type: ignore[misc]

    @property
    def root_device(self) -> torch.device:
        """The SPMD virtual device, ``xla:0``, standing for every device of the mesh."""
        return torch.device("xla", 0)

    @property
    def world(self) -> _world.World:
        """This host's world: one process per host (:func:`~xla_plugins.runtime._world.one_process_per_host`).

        Read from ``torch_xla.runtime`` through :func:`~xla_plugins.runtime._probes.runtime_figures` (a
        probe process before the runtime runs here). On one host: world size 1, every rank 0.

        Raises:
            ValueError: torchrun started several processes on this host
                (:func:`~xla_plugins.roles.environment.check_one_process_per_host`); the runtime's figures are
                inconsistent or show several processes per host.
        """
        check_one_process_per_host()
        return _world.one_process_per_host(_probes.runtime_figures())

    @property
    def world_size(self) -> int:
        """Hosts of the slice (``torch_xla.runtime.process_count()``); 1 on one host."""
        return self.world.world_size

    @property
    def global_rank(self) -> int:
        """This host's index (``torch_xla.runtime.process_index()``); 0 on one host."""
        return self.world.global_rank

    @property
    def local_rank(self) -> int:
        """0: one process per host."""
        return self.world.local_rank

    @property
    def node_rank(self) -> int:
        """This host's index, as :attr:`global_rank` (one process per host)."""
        return self.world.node_rank

    @property
    def num_nodes(self) -> int:
        """Hosts of the slice, from the runtime (Lightning's ``num_nodes`` flag is not needed)."""
        return self.world.num_nodes

    @num_nodes.setter
    def num_nodes(self, num_nodes: int) -> None:
        # Lightning's connectors assign their `num_nodes` flag; the runtime's host count rules, as
        # XLAEnvironment ignores Lightning's set_world_size.
        self._num_nodes_flag = num_nodes

    @property
    def is_distributed(self) -> bool:
        """Whether the run spans several hosts (the connector's rule 2 reads it).

        ``False`` on one host: one process drives the mesh, so no sampler is injected and metrics
        are not synced. ``True`` on several: Lightning then injects a ``DistributedSampler`` over the
        hosts (:attr:`distributed_sampler_kwargs`) and syncs host values with :meth:`reduce`.
        """
        return self.world.world_size > 1

    @property
    def distributed_sampler_kwargs(self) -> Optional[dict[str, int]]:
        """``None`` on one host (the loader's own order is dealt out to the devices); on several,
        ``{"num_replicas": hosts, "rank": host}``: each host loads its own share of the data set
        (see :func:`~xla_plugins.runtime._world.host_sampler_kwargs`)."""
        return _world.host_sampler_kwargs(self.world)

    @property
    def local_num_devices(self) -> int:
        """Devices of this host (``addressable_runtime_device_count``; ``parallel_devices`` before setup)."""
        if self._mesh is not None:
            return _probes.runtime_figures().addressable_device_count
        return len(getattr(self, "parallel_devices", None) or ()) or 1

    @property
    def num_devices(self) -> int:
        """Devices of the mesh (of ``parallel_devices`` before setup)."""
        if self._mesh is not None:
            return int(self._mesh.size())
        return len(getattr(self, "parallel_devices", None) or ()) or 1

    @property
    def mesh(self) -> Any:
        """The ``torch_xla.distributed.spmd.Mesh`` over all devices (``None`` before setup)."""
        return self._mesh

    def _enter_spmd(self) -> None:
        """Enter SPMD mode (``torch_xla.runtime.use_spmd``) and build the mesh over all devices.

        Raises:
            ValueError: torchrun started more than one process on this host
                (:func:`~xla_plugins.roles.environment.check_one_process_per_host`).
        """
        check_one_process_per_host()  # before the runtime starts
        import torch_xla.runtime as xr

        if not xr.is_spmd():  # SPMD mode is permanent: a second run in this process is already in it
            xr.use_spmd()
        self._mesh = self._build_mesh(xr.global_runtime_device_count())

    def _build_mesh(self, count: int) -> Any:
        """A 1-D mesh over ``count`` devices, axis :data:`DATA_AXIS` (sharded strategies build their own)."""
        import numpy as np
        import torch_xla.distributed.spmd as xs

        return xs.Mesh(np.arange(count), (count,), (DATA_AXIS,))

    @property
    def batch_axes(self) -> Union[str, tuple[str, ...]]:
        """The mesh axis (or axes, major first) a batch's first dimension is sharded over: :data:`DATA_AXIS`."""
        return DATA_AXIS

    def shard_batch(self, batch: Any) -> Any:
        """Move ``batch``'s tensors to the virtual device and shard their first dimension over the mesh.

        On one host the batch is the global batch; uneven first dimensions are padded by XLA and
        scalars stay replicated. On several hosts the batch is this host's share of the global batch
        and goes to the device with torch_xla's ``minibatch`` input sharding
        (``xs.ShardingSpec(mesh, ..., minibatch=True)``, as ``MpDeviceLoader(input_sharding=...)``
        sends it), which assembles the global batch from every host's share; torch_xla then requires
        each host's share to divide evenly by its devices.
        """
        import torch_xla.distributed.spmd as xs

        several = self.hosts.several

        def shard(tensor: Tensor) -> Tensor:
            if several and self._mesh is not None and tensor.dim() > 0:
                return _send_host_share(tensor, self._mesh, self.batch_axes, self.root_device)
            tensor = tensor.to(self.root_device)
            if self._mesh is not None and tensor.dim() > 0:
                xs.mark_sharding(tensor, self._mesh, (self.batch_axes,) + (None,) * (tensor.dim() - 1))
            return tensor

        return apply_to_collection(batch, Tensor, shard)

    def global_batches(
        self, dataloader: Any, transform: Optional[Any] = None, name: Optional[str] = None
    ) -> _batches.GlobalBatches:
        """``dataloader`` yielding one global batch per step, by the strategy's ``batch`` meaning.

        Logs the per-device and global batch once per distinct description, after ``name`` (the
        loader's Lightning hook, ``"train_dataloader"`` for example) when given.
        """
        if isinstance(dataloader, _batches.GlobalBatches):
            return dataloader
        line = _batches.describe(dataloader, self.batch, self.local_num_devices)
        if name:
            line = f"{name}: {line}"
        if self.hosts.several:
            line += f"; on each of {self.world.world_size} hosts (each loads its own share of the data set)"
        if line not in self._described:
            self._described.add(line)
            rank_zero_info(f"trainer-plugins: {self._log_name}: {line}")
        return _batches.GlobalBatches(dataloader, self.loader_batches_per_step(), transform)

    def loader_batches_per_step(self) -> int:
        """Loader batches joined into one step's global batch (:func:`._batches.loader_batches_per_step`)."""
        return _batches.loader_batches_per_step(self.batch, self.local_num_devices)

    def _as_global(
        self,
        tensor: Union[Tensor, Any],
        group: Optional[Any] = None,
        reduce_op: Optional[Union[ReduceOp, str]] = "mean",
    ) -> Tensor:
        """``tensor`` reduced as DDP reduces over its ranks (here: the hosts); ``group`` is ignored.

        An XLA tensor is returned as it is: it is global already (computed over the global batch).
        On one host, a number becomes a tensor on the device. On several hosts, numbers and CPU
        tensors are host values and are reduced over the hosts
        (:meth:`~xla_plugins.strategies._hosts.HostGroup.reduce`).

        Raises:
            ValueError: ``reduce_op`` is not one Lightning supports (see
                :func:`~xla_plugins.strategies._reduce.reduce_op_name`).
        """
        reduce_op_name(reduce_op)
        if self.hosts.several:
            return self.hosts.reduce(tensor, reduce_op)
        return tensor if isinstance(tensor, Tensor) else torch.tensor(tensor, device=self.root_device)

    def _place_module(self, module: Module) -> Module:
        """``module`` on the virtual device, its parameters replicated on every device of the mesh, ties kept.

        The sharded strategies wrap it instead (:class:`~xla_plugins.strategies.xla_fsdp_v2.XLAFSDPv2Strategy`).
        """
        return move_module(module, self.root_device)

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """``decision`` of every host combined with ``all`` (default) or ``any``, as Lightning's ``ParallelStrategy``.

        A decision is a host value (callbacks decide from what they saw on their host), so it is
        reduced over the hosts (:class:`~xla_plugins.strategies._hosts.HostGroup`), never read as
        a global XLA tensor; on one host, ``decision`` itself.
        """
        if not self.hosts.several:
            return bool(decision)
        total = self.hosts.reduce(torch.tensor(int(bool(decision))), "sum")
        return bool(total == self.world.world_size) if all else bool(total > 0)

    def all_gather(self, tensor: Tensor, group: Optional[Any] = None, sync_grads: bool = False) -> Tensor:
        """``tensor`` itself when it is an XLA tensor (global already) or on one host; on several hosts a
        CPU tensor of each host, stacked along a new first dimension as DDP gathers."""
        return self.hosts.all_gather(tensor)

    def broadcast(self, obj: TBroadcast, src: int = 0) -> TBroadcast:
        """``obj`` of host ``src`` on every host (itself on one host)."""
        return self.hosts.broadcast(obj, src)

    def barrier(self, name: Optional[str] = None, *args: Any, **kwargs: Any) -> None:
        """Wait for every host (nothing to wait for on one host: one process)."""
        self.hosts.barrier()


def _send_host_share(tensor: Tensor, mesh: Any, axes: Union[str, tuple[str, ...]], device: torch.device) -> Tensor:
    """Send one host's share ``tensor`` (CPU) to ``device`` as its rows of a batch sharded over ``mesh``'s ``axes``.

    torch_xla's multi-host input path (``xm.send_cpu_data_to_device`` with a ``minibatch``
    ``ShardingSpec``): the global batch is the hosts' shares joined along the first dimension.

    Raises:
        RuntimeError: torch_xla's, when the share's first dimension does not divide by this host's devices.
    """
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.spmd as xs

    spec = xs.ShardingSpec(mesh, (axes,) + (None,) * (tensor.dim() - 1), minibatch=True)
    return xm.send_cpu_data_to_device([tensor.cpu()], device, spec)[0]
