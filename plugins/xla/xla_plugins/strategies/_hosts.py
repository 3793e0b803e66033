"""Collectives between the hosts of a slice for the one-process-per-host (SPMD) strategies.

Under SPMD, an XLA tensor is one *global* value: every host holds the same logical tensor, computed
over the global batch, and XLA's compiled program already reduced across hosts what needed it. So
``reduce`` and ``all_gather`` return XLA tensors as they are: a DDP rank's value is its share's
partial result, which Lightning's reduction over the ranks completes (sum of partial sums, mean of
equal-sized means, max of maxima); the global value is that completed result already.

Values that live on the host (Python numbers, CPU tensors: a count of files read, a timing) differ
between hosts, as DDP ranks' values do, and are reduced or gathered across the hosts for real, over
a ``torch.distributed`` gloo process group, the CPU group torch_xla's SPMD guides pair with its
``xla://`` rendezvous (world size ``process_count``, rank ``process_index``). Objects are broadcast
and barriers are kept over the same group. On one host every operation is the identity (or does
nothing) and no process group is created. Lightning's ``self.log`` turns a Python number into an
XLA tensor: that value is then taken as global; a CPU tensor logged with ``sync_dist`` is reduced.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
from torch import Tensor

from xla_plugins.runtime._world import World
from xla_plugins.strategies._reduce import REDUCE_OPS, averaged, reduce_op_name

#: torch.distributed backend of the host group: CPU tensors between the hosts' processes.
BACKEND = "gloo"
#: Rendezvous of the host group: torch_xla's (``torch_xla.distributed.xla_backend`` registers it).
INIT_METHOD = "xla://"


class HostGroup:
    """The hosts of one run, as ranks of a ``torch.distributed`` process group (one process per host).

    Args:
        world: the host's :class:`~xla_plugins.runtime._world.World`.
    """

    def __init__(self, world: World) -> None:
        self.world = world

    @property
    def several(self) -> bool:
        """Whether there is more than one host (else every operation is local)."""
        return self.world.world_size > 1

    def connect(self) -> None:
        """Join the hosts' process group (on one host: nothing).

        Uses the default ``torch.distributed`` group when one is initialized already (as Lightning's
        ``_init_dist_connection`` does), else initializes one with :data:`BACKEND` through torch_xla's
        :data:`INIT_METHOD` rendezvous (``MASTER_ADDR``/``MASTER_PORT`` override the discovered
        address and port 12355).

        Raises:
            RuntimeError: an initialized group whose size or rank is not this world's (names both).
        """
        if not self.several:
            return
        import torch.distributed as dist

        if not dist.is_initialized():
            import torch_xla.distributed.xla_backend  # noqa: F401  registers the xla:// rendezvous

            dist.init_process_group(BACKEND, init_method=INIT_METHOD)
        size, rank = dist.get_world_size(), dist.get_rank()
        if (size, rank) != (self.world.world_size, self.world.global_rank):
            raise RuntimeError(
                f"The torch.distributed process group has world size {size} and rank {rank}, but torch_xla"
                f" reports {self.world.world_size} hosts and this one as {self.world.global_rank}."
                " Start the script once on every host of the slice (gcloud ... --worker=all)."
            )

    def reduce(self, value: Union[Tensor, Any], reduce_op: Optional[Any]) -> Union[Tensor, Any]:
        """``value`` reduced over the hosts as DDP reduces over its ranks.

        XLA tensors are global and returned as they are; numbers and CPU tensors are reduced across
        the hosts with ``reduce_op`` (sum, mean/avg, max, min). A number comes back as a tensor.

        Raises:
            ValueError: ``reduce_op`` is not one Lightning supports.
        """
        name = reduce_op_name(reduce_op)
        if isinstance(value, Tensor) and value.device.type == "xla":
            return value
        if not self.several:
            return value
        import torch.distributed as dist

        tensor = value.detach().clone() if isinstance(value, Tensor) else torch.tensor(value)
        dist.all_reduce(tensor, op=getattr(dist.ReduceOp, REDUCE_OPS[name].upper()))
        return averaged(name, tensor, self.world.world_size)

    def all_gather(self, tensor: Tensor) -> Tensor:
        """``tensor`` of every host stacked along a new first dimension (``world_size``), as DDP's.

        XLA tensors are global and returned as they are; on one host, ``tensor`` itself.
        """
        if tensor.device.type == "xla" or not self.several:
            return tensor
        import torch.distributed as dist

        parts = [torch.empty_like(tensor) for _ in range(self.world.world_size)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.stack(parts)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Host ``src``'s ``obj`` on every host (``torch.distributed.broadcast_object_list``)."""
        if not self.several:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def barrier(self) -> None:
        """Wait until every host got here (``torch.distributed.barrier``)."""
        if self.several:
            import torch.distributed as dist

            dist.barrier()
