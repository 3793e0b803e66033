"""The kernels of the stand-in ``"tpu"`` device: one fallback for every op, a few ops of its own.

The PrivateUse1 fallback (:func:`fallback`) runs each op's CPU kernel: ``"tpu"`` arguments become
zero-copy CPU views (:func:`._memory.cpu_view`), a ``"tpu"`` device argument becomes ``"cpu"``, and
every CPU tensor of the result becomes a ``"tpu"`` tensor again: the argument itself for an in-place
op, a ``"tpu"`` view of the argument's storage for a view op, an adopted storage for a new tensor.
``out=`` tensors are computed into fresh CPU tensors and copied back, growing the ``"tpu"`` tensor when
the result needs more room (the CPU view of a ``"tpu"`` storage cannot grow).

Ops without a CPU kernel of the same name get their own here: ``convolution_overrideable`` (what
torch calls for convolutions on a device it has no kernel for) and its backward, and the storage-level
``resize_`` and ``set_`` ops, which must act on the ``"tpu"`` tensor itself.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

from torchtpu_plugins.standin import _memory

aten = torch.ops.aten
_CPU = torch.device("cpu")


def _check_index(device: torch.device) -> None:
    if device.index not in (None, 0):
        raise RuntimeError(
            f"the TorchTPU stand-in binds each process to device tpu:0; got {device} "
            "(read torch.accelerator.current_device_index(); TORCHTPU_PLUGINS_DEVICE_COUNT sets device_count only)"
        )


def _convolution_backward(grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, *rest: Any) -> Any:
    """``convolution_backward_overrideable`` as ``convolution_backward``, which also wants the bias's size.

    ``rest``: stride, padding, dilation, transposed, output_padding, groups, output_mask (both ops' order).
    """
    transposed, groups = rest[3], rest[5]
    bias_sizes = [weight.size(1) * groups if transposed else weight.size(0)]  # out_channels
    return aten.convolution_backward.default(grad_output, input, weight, bias_sizes, *rest)


def _copy_from(self: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    return dst.copy_(self)  # the copy is done when it returns: non_blocking changes nothing


#: Ops run as another CPU op (CPU has no kernel of their name), on the converted arguments.
_CPU_EQUIVALENT: dict[Any, Callable[..., Any]] = {
    aten.convolution_overrideable.default: aten.convolution.default,  # the same arguments
    aten.convolution_backward_overrideable.default: _convolution_backward,
    aten._copy_from.default: _copy_from,
}


def _resize(self: torch.Tensor, size: list[int], memory_format: torch.memory_format | None = None) -> torch.Tensor:
    """``resize_`` of a ``"tpu"`` tensor: a new, larger storage when the bytes do not fit (contents kept)."""
    if memory_format not in (None, torch.contiguous_format, torch.preserve_format):
        raise RuntimeError(f"the TorchTPU stand-in resizes to contiguous_format only; got {memory_format}")
    stride = torch.empty(size, device="meta").stride()
    numel = 1
    for dim in size:
        numel *= dim
    needed = (self.storage_offset() + numel) * self.element_size()
    storage = self.untyped_storage()
    if needed > storage.nbytes():
        grown = torch.empty(needed, dtype=torch.uint8)
        grown[: storage.nbytes()].copy_(
            _memory.cpu_view(_memory.tpu_tensor(storage, torch.uint8, 0, (storage.nbytes(),), (1,)))
        )
        storage = _memory.adopt_storage(grown.untyped_storage())
    return _set(self, storage, int(self.storage_offset()), tuple(size), tuple(stride))


def _set(self: torch.Tensor, storage: torch.UntypedStorage, offset: int, size: Any, stride: Any) -> torch.Tensor:
    return aten.set_.source_Storage_storage_offset.redispatch(_memory._CPU_KEYS, self, storage, offset, size, stride)


def _set_from_storage(self: torch.Tensor, source: Any) -> torch.Tensor:
    storage = source._untyped_storage if isinstance(source, torch.TypedStorage) else source
    return _set(self, storage, 0, (storage.nbytes() // self.element_size(),), (1,))


def _set_from_tensor(self: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    return _set(
        self, source.untyped_storage(), int(source.storage_offset()), tuple(source.size()), tuple(source.stride())
    )


def _set_empty(self: torch.Tensor) -> torch.Tensor:
    return _set(self, _memory.adopt_storage(torch.empty(0, dtype=torch.uint8).untyped_storage()), 0, (0,), (1,))


def _copy_from_and_resize(self: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    if dst.device.type == "tpu":
        _resize(dst, list(self.shape))
    else:
        dst.resize_(self.shape)
    return dst.copy_(self)


#: Ops acting on the "tpu" tensor itself, called with the original arguments.
_ON_TPU: dict[Any, Callable[..., Any]] = {
    aten.resize_.default: _resize,
    aten.set_.source_Storage_storage_offset: _set,
    aten.set_.source_Storage: _set_from_storage,
    aten.set_.source_Tensor: _set_from_tensor,
    aten.set_.default: _set_empty,
    aten._copy_from_and_resize.default: _copy_from_and_resize,
}


def fallback(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    """Run ``op`` for ``"tpu"`` tensors on its CPU kernel, without copying them (module docstring).

    Raises:
        RuntimeError: a ``"tpu"`` device index other than 0, or the CPU kernel's own error.
    """
    on_tpu = _ON_TPU.get(op)
    if on_tpu is not None:
        return on_tpu(*args, **kwargs)
    originals: dict[int, torch.Tensor] = {}  # id of a CPU view -> its "tpu" tensor
    adopted: dict[int, torch.UntypedStorage] = {}  # CPU storage -> the "tpu" storage it views

    def to_cpu(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.device.type == "tpu":
            _check_index(value.device)
            view = _memory.cpu_view(value)
            originals[id(view)] = value
            adopted[view.untyped_storage()._cdata] = value.untyped_storage()
            return view
        if isinstance(value, torch.device) and value.type == "tpu":
            _check_index(value)
            return _CPU
        return value

    host = {id(value) for value in tree_leaves((args, kwargs)) if isinstance(value, torch.Tensor)}  # CPU arguments
    # an op told device="cpu" (a copy to the host) returns CPU tensors; every other op "tpu" tensors
    to_host = any(isinstance(value, torch.device) and value.type == "cpu" for value in kwargs.values())
    cpu_args, cpu_kwargs = tree_map(to_cpu, (args, kwargs))
    if cpu_kwargs.get("pin_memory"):
        cpu_kwargs["pin_memory"] = False  # host RAM is the device's memory already
    if cpu_kwargs.get("non_blocking"):
        cpu_kwargs["non_blocking"] = False  # every kernel has finished when it returns: nothing to overlap
    written_back: list[tuple[torch.Tensor, torch.Tensor]] = []  # ("tpu" out= tensor, fresh CPU result)
    for argument in op._schema.arguments:
        if argument.is_out and isinstance(cpu_kwargs.get(argument.name), torch.Tensor):
            view = cpu_kwargs[argument.name]
            if id(view) in originals:
                fresh = torch.empty(0, dtype=view.dtype)
                written_back.append((originals[id(view)], fresh))
                originals[id(fresh)] = originals[id(view)]
                cpu_kwargs[argument.name] = fresh
    result = _CPU_EQUIVALENT.get(op, op)(*cpu_args, **cpu_kwargs)
    for tpu_out, fresh in written_back:
        if tpu_out.shape != fresh.shape:
            _resize(tpu_out, list(fresh.shape))
        _memory.cpu_view(tpu_out).copy_(fresh)

    def to_tpu(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.device.type == "cpu" and id(value) not in host and not to_host:
            original = originals.get(id(value))
            return original if original is not None else _memory.to_tpu(value, adopted)
        return value

    return tree_map(to_tpu, result)


def register() -> list[torch.library.Library]:
    """Register :func:`fallback` for PrivateUse1, and for the ops that torch gives a raising default kernel.

    ``convolution_overrideable`` and its backward have a kernel for every backend (one that raises
    "not implemented"), and ``_to_copy``'s kernel for every backend asks PrivateUse1 for pinned host
    memory on a non-blocking copy to the host (which a device registered from Python cannot provide):
    the fallback never sees them, so they get it as their PrivateUse1 kernel.

    Returns:
        The ``torch.library.Library`` objects holding the registrations (they last as long as those do).
    """
    library = torch.library.Library("_", "IMPL")
    library.fallback(fallback, "PrivateUse1")
    overrides = torch.library.Library("aten", "IMPL")
    for op in (
        aten.convolution_overrideable.default,
        aten.convolution_backward_overrideable.default,
        aten._to_copy.default,
    ):
        overrides.impl(op._schema.name.split("::")[1], functools.partial(fallback, op), "PrivateUse1")
    return [library, overrides]
