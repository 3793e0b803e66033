"""The process group a ``"tpu"`` strategy reduces over when a launcher made the default group before it.

Ray Train's ``TorchTrainer`` initialises ``torch.distributed``'s default group before the user's
function runs: ``"tpu_dist"`` where its workers hold a ``TPU`` resource (Ray >= 2.58, which imports
``torch_tpu`` to register it), otherwise ``"gloo"``. Lightning's ``_init_dist_connection`` then keeps
that group, and a ``"gloo"`` group has no backend for the ``"tpu"`` device: a collective of a ``"tpu"``
tensor over it raises ``RuntimeError: No backend type associated with device type tpu``.

The strategies keep the launcher's group (its ranks, store and CPU collectives) and run the
collectives of ``"tpu"`` tensors (DDP's, ``reduce``/``all_reduce``, ``all_gather``) over a second group of
the same ranks on the ``"tpu"`` device's backend, made with ``torch.distributed.new_group``. A
composite group such as ``"cpu:gloo,tpu:tpu_dist"`` (TorchTPU's own tests use it) or ``"tpu_dist"``
itself needs no second group. Not verified on TPU.
"""

from __future__ import annotations

from typing import Any, Optional

import torch.distributed as dist

from torchtpu_plugins.runtime._probes import DEVICE_TYPE


def default_backend() -> str:
    """The default group's backend, as ``torch.distributed.get_backend`` names it (``"gloo"``, ``"tpu_dist"``, ...)."""
    return str(dist.get_backend())


def reduces_tpu_tensors(backend: str) -> bool:
    """Whether a group made with ``backend`` has a backend for the ``"tpu"`` device (torch's ``BackendConfig``)."""
    return DEVICE_TYPE in dist.distributed_c10d.BackendConfig(dist.Backend(backend)).get_device_backend_map()


def tpu_group() -> Optional[Any]:
    """A group of every rank on the ``"tpu"`` device's backend, or ``None`` where the default group has one.

    A collective call: every rank of the default group must make it (each strategy's process-group
    start does, on every rank).

    Raises:
        RuntimeError: ``torch.distributed`` maps no backend to ``"tpu"`` (neither torch_tpu nor the
            stand-in registered one).
    """
    if reduces_tpu_tensors(default_backend()):
        return None
    backend = dist.Backend.default_device_backend_map.get(DEVICE_TYPE)
    if backend is None:
        raise RuntimeError(
            f"the default process group ({default_backend()!r}) has no backend for 'tpu' tensors and torch.distributed"
            " maps none to 'tpu' (torch_tpu, or the stand-in TORCHTPU_PLUGINS_DEVICE=cpu, registers 'tpu_dist')"
        )
    return dist.new_group(backend=backend)


def destroy(group: Optional[Any]) -> None:
    """Destroy ``group`` (one made by :func:`tpu_group`) if the default group still exists; ``None`` does nothing."""
    if group is not None and dist.is_initialized():
        dist.destroy_process_group(group)
