"""Reductions across XLA replicas with the operations Lightning supports (sum, mean/avg, max, min)."""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
from lightning.fabric.utilities.types import ReduceOp
from torch import Tensor

#: Lightning's reduce operations (``reduce_fx``/``reduce_op`` names) -> the reduction over the replicas
#: that computes them: torch_xla's reduce type, upper-cased the ``torch.distributed.ReduceOp`` member.
#: ``mean``/``avg`` are a sum, then divided by the world size (:func:`averaged`).
REDUCE_OPS = {"sum": "sum", "mean": "sum", "avg": "sum", "max": "max", "min": "min"}
_ENUM_NAMES = {"SUM": "sum", "AVG": "avg", "MAX": "max", "MIN": "min"}


def reduce_op_name(reduce_op: Optional[Union[ReduceOp, str]]) -> str:
    """The lower-case name of ``reduce_op``: ``"sum"``, ``"mean"``, ``"avg"``, ``"max"`` or ``"min"``.

    ``None`` means ``"mean"`` (Lightning's default). ``torch.distributed.ReduceOp`` members SUM, AVG,
    MAX and MIN are accepted as DDP accepts them.

    Raises:
        ValueError: any other operation, naming it and listing the valid ones.
    """
    if reduce_op is None:
        return "mean"
    name = reduce_op.lower() if isinstance(reduce_op, str) else None
    if name is None:
        name = next((value for key, value in _ENUM_NAMES.items() if reduce_op == getattr(ReduceOp, key, None)), None)
    if name not in REDUCE_OPS:
        raise ValueError(
            f"XLA strategies reduce with one of {', '.join(map(repr, REDUCE_OPS))} (or ReduceOp SUM, AVG, MAX, MIN),"
            f" got reduce_op={reduce_op!r}"
        )
    return name


def averaged(name: str, reduced: Tensor, world_size: int) -> Tensor:
    """``reduced`` (a sum over ``world_size`` ranks) divided by ``world_size`` for ``mean``/``avg``, else itself.

    Lightning's rule, as for DDP on gloo: an integer tensor's mean is floating point.
    """
    return reduced / world_size if name in ("mean", "avg") else reduced


def all_reduce(
    tensor: Union[Tensor, Any], reduce_op: Optional[Union[ReduceOp, str]], world_size: int, device: Any
) -> Tensor:
    """Reduce ``tensor`` over all replicas with ``xm.all_reduce``, as DDP's ``reduce`` does over ranks.

    Every replica must call it (it is a collective). A non-tensor is first made a tensor on
    ``device``. ``mean``/``avg`` sum, then divide by ``world_size`` (:func:`averaged`).

    Raises:
        ValueError: unsupported ``reduce_op`` (see :func:`reduce_op_name`).
    """
    import torch_xla.core.xla_model as xm

    name = reduce_op_name(reduce_op)
    if not isinstance(tensor, Tensor):
        tensor = torch.tensor(tensor, device=device)
    if world_size > 1:
        import torch_xla

        reduced = xm.all_reduce(REDUCE_OPS[name], tensor)
        # Run the collective now, on every replica at the same point, as Lightning's own XLA reduce
        # does (its xm.mesh_reduce syncs the graph). Left pending, it ran inside whatever executed the
        # result first (e.g. a `.item()` on one replica), and replica threads diverged: XLA aborted
        # with one thread in this all-reduce and another in the next collective (tests/test_fabric.py).
        torch_xla.sync()
    else:
        reduced = tensor
    return averaged(name, reduced, world_size)
