"""Storage allocation on the stand-in device, where torch would crash for want of an allocator.

A ``"tpu"`` storage of the stand-in has no allocator (:mod:`._memory`), and torch's C++ storage
constructor finds none for PrivateUse1: ``torch.UntypedStorage(n, device="tpu")``,
``storage.clone()`` and so ``copy.deepcopy`` of a ``"tpu"`` tensor (Lightning's ``ModelCheckpoint``
deep-copies state) would dereference a null allocator. :func:`install` routes those two Python entry
points to host memory adopted as a ``"tpu"`` storage.

Nor can a ``"tpu"`` storage of the stand-in change its size: torch's Python backend API gives
PrivateUse1 no resize hook, and torch raises ``NotImplementedError``. torch's FSDP2 (``fully_shard``)
frees each gathered parameter with ``resize_(0)`` and allocates it again at its size before the next
all-gather; on the stand-in a ``"tpu"`` storage resized to 0 bytes or to its own size keeps its memory
(the values FSDP2 computes are the same; the memory is not released), any other size raises.
"""

from __future__ import annotations

from typing import Any

import torch

from torchtpu_plugins.standin import _memory

_original_new = torch.UntypedStorage.__new__
_original_clone = torch.UntypedStorage.clone
_original_resize = torch.UntypedStorage.resize_


def _is_tpu(device: Any) -> bool:
    return device is not None and torch.device(device).type == "tpu"


def _new(cls: type, *args: Any, device: Any = None, **kwargs: Any) -> Any:
    if cls is torch.UntypedStorage and _is_tpu(device):
        if kwargs or len(args) != 1 or not isinstance(args[0], int):
            raise RuntimeError(
                f"the TorchTPU stand-in creates 'tpu' storages from a byte count only: "
                f"UntypedStorage(nbytes, device='tpu'); got args={args!r}, kwargs={kwargs!r}"
            )
        return _memory.adopt_storage(torch.UntypedStorage(args[0]))
    if device is not None:
        kwargs["device"] = device
    return _original_new(cls, *args, **kwargs)


def _clone(self: torch.UntypedStorage) -> torch.UntypedStorage:
    if self.device.type != "tpu":
        return _original_clone(self)
    copy = torch.UntypedStorage(self.nbytes())
    copy.copy_(_memory.cpu_view(_memory.tpu_tensor(self, torch.uint8, 0, (self.nbytes(),), (1,))).untyped_storage())
    return _memory.adopt_storage(copy)


def _resize(self: torch.UntypedStorage, size: int) -> torch.UntypedStorage:
    """Keep a ``"tpu"`` storage resized to 0 bytes or to its own size as it is (FSDP2's free and re-allocation).

    Raises:
        RuntimeError: any other size for a ``"tpu"`` storage (the stand-in cannot move its memory).
    """
    if self.device.type != "tpu":
        return _original_resize(self, size)
    if size in (0, self.nbytes()):
        return self
    raise RuntimeError(
        f"the TorchTPU stand-in cannot resize a 'tpu' storage of {self.nbytes()} bytes to {size} bytes (torch's"
        " Python backend API has no resize for PrivateUse1); it keeps a storage resized to 0 or to its own size"
    )


def install() -> None:
    """Route ``UntypedStorage(n, device="tpu")``, ``clone()`` and ``resize_()`` of ``"tpu"`` storages (host memory)."""
    torch.UntypedStorage.__new__ = _new  # type: ignore[method-assign]
    torch.UntypedStorage.clone = _clone  # type: ignore[method-assign, assignment]
    torch.UntypedStorage.resize_ = _resize  # type: ignore[method-assign, assignment]
