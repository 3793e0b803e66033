"""Memory of the stand-in ``"tpu"`` device: host RAM, shared zero-copy between ``"tpu"`` and CPU tensors.

A ``"tpu"`` storage is adopted from a CPU storage through DLPack: the CPU storage's DLPack capsule is
relabelled as an extension device (``kDLExtDev``, which torch maps to PrivateUse1), so the ``"tpu"``
storage keeps the CPU storage alive and frees it through DLPack's deleter. Such a storage has no
allocator: torch code that allocates a new storage of the same device from it (``storage.clone()``,
``copy.deepcopy``) would crash, which :mod:`torchtpu_plugins.standin._guards` intercepts.
The other way, a zero-copy CPU view of a ``"tpu"`` tensor is a CPU storage over the same pointer that
owns nothing: valid while the ``"tpu"`` tensor lives (the fallback kernel's duration).
"""

from __future__ import annotations

import ctypes

import torch
import torch.utils.dlpack

from torchtpu_plugins.runtime import _torch_contract

#: DLPack's device type of an extension device, which torch's ``from_dlpack`` maps to PrivateUse1.
_DL_EXT_DEV = 12
_CPU_KEYS = _torch_contract.resolve("_C.DispatchKeySet")(_torch_contract.resolve("_C.DispatchKey").CPU)
_construct_storage = _torch_contract.resolve("_C._construct_storage_from_data_pointer")
_create_empty = _torch_contract.resolve("_C._acc.create_empty_tensor")

_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def adopt_storage(cpu_storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """A ``"tpu:0"`` storage over ``cpu_storage``'s bytes, which it keeps alive (no copy)."""
    cpu_bytes = torch.empty(0, dtype=torch.uint8).set_(cpu_storage)
    capsule = torch.utils.dlpack.to_dlpack(cpu_bytes)
    name = _capsule_name(capsule)
    if name != b"dltensor":  # torch 2.11 to 2.15 hand out unversioned DLManagedTensor capsules
        raise RuntimeError(f"unexpected DLPack capsule {name!r} from torch {torch.__version__}")
    # DLManagedTensor starts with DLTensor {void* data; DLDevice {int32 device_type; int32 device_id}; ...}
    ctypes.c_int32.from_address(_capsule_pointer(capsule, name) + ctypes.sizeof(ctypes.c_void_p)).value = _DL_EXT_DEV
    return torch.utils.dlpack.from_dlpack(capsule).untyped_storage()


def tpu_tensor(
    storage: torch.UntypedStorage, dtype: torch.dtype, offset: int, size: tuple[int, ...], stride: tuple[int, ...]
) -> torch.Tensor:
    """A ``"tpu"`` tensor on ``storage`` (a ``"tpu"`` storage) with this dtype and geometry (in elements)."""
    shell = _create_empty([0], dtype)
    torch.ops.aten.set_.source_Storage_storage_offset.redispatch(_CPU_KEYS, shell, storage, offset, size, stride)
    return shell


def to_tpu(cpu: torch.Tensor, adopted: dict[int, torch.UntypedStorage]) -> torch.Tensor:
    """The ``"tpu"`` tensor over ``cpu``'s memory (no copy); ``adopted`` maps CPU storages already adopted."""
    cpu_storage = cpu.untyped_storage()
    key = cpu_storage._cdata
    if key not in adopted:
        adopted[key] = adopt_storage(cpu_storage)
    return tpu_tensor(adopted[key], cpu.dtype, int(cpu.storage_offset()), tuple(cpu.size()), tuple(cpu.stride()))


def cpu_view(tpu: torch.Tensor) -> torch.Tensor:
    """A CPU tensor over ``tpu``'s memory (no copy), valid while ``tpu``'s storage lives.

    Its storage cannot grow: a kernel that resizes it raises ``RuntimeError`` ("not resizable").
    """
    storage = tpu.untyped_storage()
    cpu_storage = _construct_storage(storage.data_ptr(), torch.device("cpu"), storage.nbytes())
    return torch.empty(0, dtype=tpu.dtype).set_(cpu_storage, tpu.storage_offset(), tpu.size(), tpu.stride())
