"""The ``"tpu_dist"`` process-group backend of the stand-in: torch.distributed's gloo on zero-copy views.

TorchTPU maps the ``"tpu"`` device to the ``"tpu_dist"`` backend, and Lightning reads the backend from
that map (``torch.distributed.Backend.default_device_backend_map``). The stand-in's ``"tpu_dist"``
runs each collective of a ``"tpu"`` tensor as gloo's on the tensor's zero-copy CPU view, so the
result lands in the ``"tpu"`` tensor's own memory (CPU tensors go to gloo as they are). Collectives
complete before they return (the returned work is done): the stand-in overlaps nothing.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_map

from torchtpu_plugins.standin import _memory

#: The process-group backend name TorchTPU registers for the "tpu" device.
BACKEND = "tpu_dist"
#: The collectives forwarded to gloo (those DDP, Lightning and torch.distributed's object collectives call).
COLLECTIVES = (
    "allreduce", "allreduce_coalesced", "broadcast", "allgather", "_allgather_base", "allgather_coalesced",
    "reduce", "reduce_scatter", "_reduce_scatter_base", "gather", "scatter", "alltoall", "alltoall_base",
    "send", "recv", "recv_anysource",
)  # fmt: skip


#: torch >= 2.13's names of the single-tensor collectives (FSDP2 calls these) -> gloo's names of the same.
RENAMED = {
    "all_gather_single": "_allgather_base",
    "reduce_scatter_single": "_reduce_scatter_base",
    "all_to_all_single": "alltoall_base",
}


def _views(value: Any) -> Any:
    return tree_map(
        lambda x: _memory.cpu_view(x) if isinstance(x, torch.Tensor) and x.device.type == "tpu" else x, value
    )


class _DoneWork(dist._Work):  # type: ignore[misc, name-defined]
    """A finished collective: its future holds the caller's own tensors."""

    def __init__(self, result: Any) -> None:
        super().__init__()
        self._future: torch.futures.Future = torch.futures.Future()
        self._future.set_result(result)

    def wait(self, timeout: timedelta | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future


def _collective(name: str, gloo_name: str) -> Any:
    def run(self: TpuDistBackend, tensors: Any, *rest: Any) -> _DoneWork:
        getattr(self._gloo, gloo_name)(_views(tensors), *_views(rest)).wait()
        return _DoneWork(tensors)

    run.__name__ = name
    return run


class TpuDistBackend(dist.ProcessGroup):  # type: ignore[misc]
    """``"tpu_dist"``: gloo's collectives on the zero-copy CPU views of ``"tpu"`` tensors.

    Args:
        store: the rendezvous store torch.distributed hands a backend.
        rank: this process's rank in the group.
        size: the group's size.
        timeout: gloo's timeout for each collective.
    """

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # the constructor of a backend written in Python
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)

    def barrier(self, opts: Any = None) -> _DoneWork:
        self._gloo.barrier(opts or dist.BarrierOptions()).wait()  # type: ignore[attr-defined]
        return _DoneWork(None)

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return BACKEND

    # torch keeps a group's name and description on its device backends; a group written in Python has
    # none, so torch's getter raises "ProcessGroup name not set": DeviceMesh reads the name, and
    # torch.distributed.destroy_process_group(group) needs it to unregister the group.
    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        return self._group_name

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = desc

    @property
    def group_desc(self) -> str:
        return self._group_desc


for _name, _gloo_name in {**{name: name for name in COLLECTIVES}, **RENAMED}.items():
    setattr(TpuDistBackend, _name, _collective(_name, _gloo_name))


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> TpuDistBackend:
    return TpuDistBackend(store, rank, size, timeout)


def register() -> None:
    """Register ``"tpu_dist"`` for the ``"tpu"`` device (once per process; a second call does nothing)."""
    if dist.is_available() and BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND, _create, devices=["tpu"])
