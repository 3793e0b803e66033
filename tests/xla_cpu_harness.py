"""Test harness: real cross-device collectives for torch_xla 2.8/2.9's thread-per-device mode on PJRT CPU.

With ``PJRT_DEVICE=CPU CPU_NUM_DEVICES=N``, torch_xla's multiprocessing runs one *thread* per device
in a worker process. torch_xla 2.8/2.9 lower ``all_reduce``, ``all_gather`` and ``reduce_scatter``
without a channel id, and every thread compiles its own HLO module; XLA:CPU's in-process
rendezvous keys on the channel id when there is one and on the module's unique id otherwise, so
the threads wait under different keys and XLA aborts ("Expected N threads to join the
rendezvous"). No environment variable changes that.

:func:`install` makes that mode usable for tests of the multi-device strategy:

1. The three collectives (and ``xm._all_gather_using_all_reduce``) are replaced by lowerings that
   carry a channel id and global device ids. XLA forces every collective on one channel to one
   layout, so operands are flattened to 1-D and reshaped back; each kind uses its own channel.
   Everything built on them works: ``reduce_gradients``/``optimizer_step``,
   ``collective_broadcast``, ``broadcast_master_param``, ``rendezvous``, ``mesh_reduce``.
2. ``torch_xla._XLAC._xla_step_marker`` keeps one live tensor per device and waits (GIL released)
   for its own graph to finish: a device with no live tensor syncs against device 0's lock and
   deadlocks with device 0's collective in flight.
3. torch_xla's worker initializer is wrapped to create, from the worker's main thread, the entries
   that replica threads would otherwise insert concurrently into two unsynchronised C++ maps (the
   CPU-fallback counter of ``aten::_local_scalar_dense`` and the per-device all-reduce token).

It needs ``XLA_THREAD_POOL_SIZE >= N`` (each replica's collective holds a pool thread; use 2N) and
``PJRT_CPU_ASYNC_CLIENT=0`` (the async CPU client occasionally hangs at N=4 on two cores); see
:data:`REQUIRED_ENVIRONMENT`. Tests built on it check the strategy's logic and real data movement
between devices, not TPU's exact lowering. Install it in the main process before ``Trainer.fit``;
forked workers inherit it. Not covered: ``all_to_all``, send/recv, collective permutes.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Optional

import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.runtime as xr
from torch_xla._internal import pjrt

_ALL_REDUCE_CHANNEL = 1  # `_xla_spmd_all_reduce` always uses channel 1
_ALL_GATHER_CHANNEL = 2
_REDUCE_SCATTER_CHANNEL = 3

_install_lock = threading.Lock()
_installed = False
_keep_alive: dict[str, torch.Tensor] = {}
_original_step_marker = torch_xla._XLAC._xla_step_marker
_original_initialize = pjrt.initialize_multiprocess


def required_environment(devices: int) -> dict[str, str]:
    """The environment a process needs, on top of ``PJRT_DEVICE=CPU``, to run ``devices`` replicas."""
    return {
        "PJRT_DEVICE": "CPU",
        "CPU_NUM_DEVICES": str(devices),
        "XLA_THREAD_POOL_SIZE": str(2 * devices),
        "PJRT_CPU_ASYNC_CLIENT": "0",
    }


def _replica_groups(groups: Optional[list[list[int]]]) -> list[list[int]]:
    return groups or [list(range(xr.world_size()))]


def _all_reduce_flat(reduce_type: str, tensor: torch.Tensor, scale: float, groups: list[list[int]]) -> torch.Tensor:
    reduced = torch_xla._XLAC._xla_spmd_all_reduce(reduce_type, tensor.reshape(-1), scale, groups)
    return reduced.reshape(tensor.shape)


def all_reduce(
    reduce_type: str, inputs: Any, scale: float = 1.0, groups: Optional[list[list[int]]] = None, pin_layout: bool = True
) -> Any:
    """``xm.all_reduce`` with a channel id; a list of tensors is reduced in place, as in torch_xla."""
    if xr.world_size() == 1:
        return inputs.clone() if isinstance(inputs, torch.Tensor) else inputs
    groups = _replica_groups(groups)
    if isinstance(inputs, torch.Tensor):
        return _all_reduce_flat(reduce_type, inputs, scale, groups)
    with torch.no_grad():
        for tensor in inputs:
            tensor.copy_(_all_reduce_flat(reduce_type, tensor, scale, groups))
    return inputs


def _gather_one(
    value: torch.Tensor, dim: int = 0, groups: Optional[list[list[int]]] = None, pin_layout: bool = True
) -> torch.Tensor:
    groups = _replica_groups(groups)
    dim = dim % value.dim() if value.dim() else 0
    leading = value.movedim(dim, 0) if value.dim() else value.reshape(1)
    gathered = torch_xla._XLAC._xla_all_gather(
        leading.reshape(-1), 0, len(groups[0]), groups, False, _ALL_GATHER_CHANNEL, True
    )
    gathered = gathered.reshape((-1, *leading.shape[1:]))
    return gathered.movedim(0, dim) if value.dim() else gathered


def _copy_into(output: Any, results: Any) -> Any:
    with torch.no_grad():
        if isinstance(output, torch.Tensor):
            output.copy_(results)
        else:
            for target, result in zip(output, results, strict=True):
                target.copy_(result)
    return output


def all_gather(
    value: Any,
    dim: int = 0,
    groups: Optional[list[list[int]]] = None,
    output: Any = None,
    pin_layout: bool = True,
    channel_id: Any = None,
    use_global_device_ids: Any = None,
) -> Any:
    """``xm.all_gather`` with a channel id (a tensor, or a list of tensors gathered one by one)."""
    results = (
        _gather_one(value, dim, groups)
        if isinstance(value, torch.Tensor)
        else [_gather_one(v, dim, groups) for v in value]
    )
    return results if output is None else _copy_into(output, results)


def reduce_scatter(
    reduce_type: str,
    input: Any,
    scale: float,
    scatter_dim: int,
    shard_count: int,
    groups: Optional[list[list[int]]] = None,
    output: Any = None,
    pin_layout: bool = True,
    channel_id: Any = None,
    use_global_device_ids: Any = None,
) -> Any:  # noqa: A002
    """``xm.reduce_scatter`` with a channel id."""
    if not isinstance(input, torch.Tensor):
        results = [reduce_scatter(reduce_type, t, scale, scatter_dim, shard_count, groups) for t in input]
        return results if output is None else _copy_into(output, results)
    leading = input.movedim(scatter_dim, 0)
    token = torch_xla._XLAC._get_all_reduce_token("")
    scattered = torch_xla._XLAC._xla_reduce_scatter(
        reduce_type,
        leading.reshape(-1),
        token,
        scale,
        0,
        shard_count,
        _replica_groups(groups),
        False,
        _REDUCE_SCATTER_CHANNEL,
        True,
    )
    scattered = scattered[0] if isinstance(scattered, (tuple, list)) else scattered
    result = scattered.reshape((-1, *leading.shape[1:])).movedim(0, scatter_dim)
    return result if output is None else _copy_into(output, result)


def _step_marker(device: str = "", devices: Any = (), wait: bool = False, reset_scope: bool = True) -> None:
    current = device or torch_xla._XLAC._xla_get_default_device()
    if current not in _keep_alive:
        _keep_alive[current] = torch.zeros(1, device=current)
    _original_step_marker(device, list(devices), wait=False, reset_scope=reset_scope)
    torch_xla._XLAC._xla_wait_device_ops(devices=torch_xla._XLAC._xla_real_devices([current]))


def _initialize_worker(local_rank: int, local_world_size: int) -> None:
    _original_initialize(local_rank, local_world_size)
    warm = torch.ones(2, device=torch_xla.device())
    warm.sum().item()  # the first `aten::_local_scalar_dense` fallback creates its counter
    torch_xla.sync(wait=True)
    for device in xm.get_xla_supported_devices():
        torch_xla._XLAC._get_all_reduce_token(str(device))


def install() -> None:
    """Replace the collectives, the step marker and the worker initializer (idempotent).

    Also sets the product's documented test switch ``XLA_PLUGINS_TEST_CPU_SPAWN=1``, which lifts its
    refusal of the one-worker-per-device strategy on PJRT CPU (the product never looks for this
    harness itself).
    """
    global _installed
    with _install_lock:
        os.environ["XLA_PLUGINS_TEST_CPU_SPAWN"] = "1"
        if _installed:
            return
        xm.all_reduce = all_reduce
        xm.all_gather = all_gather
        xm._all_gather_using_all_reduce = _gather_one
        xm.reduce_scatter = reduce_scatter
        torch_xla._XLAC._xla_step_marker = _step_marker
        pjrt.initialize_multiprocess = _initialize_worker
        _installed = True
