"""The copies of a checkpoint a save takes on the training thread, before a writer thread may write it.

The training thread changes the state in place at the next step, so a background write needs a
copy the step does not touch: on the host (:func:`host_copy`, :func:`sharded_host_copy`; the step
waits for the device-to-host transfer), or on the device (:func:`device_copy`; the step waits only
until the copy is dispatched, after any step still running; the writer thread transfers it, and
the device holds one more copy of the state until then). :func:`device_copy_fits` is the rule of
the default, which copies on the device where the device has room for it.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch import Tensor

from xla_plugins.runtime import _torch_xla_contract


def host_copy(checkpoint: Any) -> Any:
    """A copy of ``checkpoint`` the training thread may keep changing: XLA tensors on the CPU, CPU tensors cloned.

    The XLA tensors go to the CPU together (torch_xla's ``xm._maybe_convert_to_cpu``, as Lightning's
    ``XLACheckpointIO``); CPU tensors are cloned (as Lightning's ``AsyncCheckpointIO`` clones
    every tensor), since the training thread may change them in place after the hand-off.
    """
    cloned = apply_to_collection(
        checkpoint, torch.Tensor, lambda t: t if t.device.type == "xla" else t.detach().clone()
    )
    return _torch_xla_contract.convert_to_cpu(cloned)


def device_copy(checkpoint: Any) -> Any:
    """A copy of ``checkpoint`` the training thread may keep changing, without waiting for the transfer.

    Each XLA tensor is cloned on the device (``Tensor.clone``) and the clones are dispatched with
    ``torch_xla.sync()``, which returns once the copy is queued; torch_xla queues it only after the
    program still running on the device (a step in flight) has ended, so the call waits for that
    (measured: docs/performance.md, "Checkpoint stall"). CPU tensors are cloned. Hand the result to
    :func:`host_copy` on another thread, which waits for the clones and transfers them.
    """
    import torch_xla

    copied = apply_to_collection(checkpoint, Tensor, lambda t: t.detach().clone())
    torch_xla.sync()
    return copied


#: The share of a device's memory that the run's peak use plus a device copy of the checkpoint may take
#: (:func:`device_copy_fits`); the rest is left for what the peak figure does not show yet.
DEVICE_COPY_MEMORY_SHARE = 0.9


def device_copy_fits(checkpoint: Any) -> bool:
    """Whether a :func:`device_copy` of ``checkpoint`` fits on its device next to the run's own use.

    On PJRT CPU always: the device's memory is the host's, where a host copy would take the same
    bytes (the writer drops the device copy once it is on the host). Elsewhere the rule reads
    torch_xla's ``xm.get_memory_info`` of the device holding the first XLA tensor: the copy fits
    when ``peak_bytes_used`` plus the checkpoint's XLA tensor bytes (``numel * element_size``, the
    whole tensor even where it is sharded, so an overestimate there) is at most
    :data:`DEVICE_COPY_MEMORY_SHARE` of ``bytes_limit``: the copy lives while the next steps run,
    which need the peak again. A runtime that reports no memory figures gets ``False``. The rule's
    effect on TPU is not verified.

    Args:
        checkpoint: a collection of tensors (Lightning's checkpoint dict).
    """
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    if xr.device_type() == "CPU":
        return True
    tensors: list[Tensor] = []
    apply_to_collection(checkpoint, Tensor, lambda t: tensors.append(t) if t.device.type == "xla" else None)
    if not tensors:
        return True
    try:
        info = xm.get_memory_info(tensors[0].device)
    except RuntimeError:  # the runtime keeps no allocator figures (PJRT's GetAllocatorStats unimplemented)
        return False
    size = sum(t.numel() * t.element_size() for t in tensors)
    return int(info["peak_bytes_used"]) + size <= DEVICE_COPY_MEMORY_SHARE * int(info["bytes_limit"])


def sharded_host_copy(tensors: Any) -> Any:
    """A host copy of ``tensors`` (state dicts of sharded modules and optimizers) that the training thread may change.

    Every XLA tensor becomes torch_xla's CPU shards (a sharded one) or a CPU tensor (a replicated
    one), through ``_sharded_cpu_state_dict``, after ``torch_xla.sync(wait=True)`` (torch_xla reads
    shards only with no execution in flight); CPU tensors (an optimizer's step count) are cloned.
    """
    import torch_xla

    torch_xla.sync(wait=True)
    cloned = apply_to_collection(tensors, Tensor, lambda t: t if t.device.type == "xla" else t.detach().clone())
    return _torch_xla_contract.sharded_cpu_state_dict(cloned)
