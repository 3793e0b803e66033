"""The copies of a checkpoint a save takes on the training thread, before a writer thread may write it.

The training thread changes the state in place at the next step, so a background write needs a
copy the step does not touch: on the host (:func:`host_copy`, :func:`sharded_host_copy`; the step
waits for the device-to-host transfer), or on the device (:func:`device_copy`; the step waits only
until the copy is dispatched, the writer thread transfers it, and the device holds one more copy
of the state until then).
"""

from __future__ import annotations

from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch import Tensor

from xla_plugins import _torch_xla_contract


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
    """A copy of ``checkpoint`` the training thread may keep changing, without waiting for the device.

    Each XLA tensor is cloned on the device (``Tensor.clone``) and the clones are dispatched with
    ``torch_xla.sync()`` (asynchronous: the call returns once the program is queued, after the
    previous one on the device started); CPU tensors are cloned. Hand the result to
    :func:`host_copy` on another thread, which waits for the clones and transfers them.
    """
    import torch_xla

    copied = apply_to_collection(checkpoint, Tensor, lambda t: t.detach().clone())
    torch_xla.sync()
    return copied


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
