"""``torch.xla``: the device module torch's device-generic code looks up for XLA tensors.

torch finds the runtime module of a device type as ``getattr(torch, device_type)``:
``torch.utils.checkpoint`` does, to save the random state of the devices its block's inputs are on
and to restore it when the block is recomputed in the backward pass, and so does
``torch.random.fork_rng(device_type=...)``. torch_xla 2.9 registers no such module, so
``torch.utils.checkpoint.checkpoint`` on XLA tensors (and Hugging Face's
``gradient_checkpointing_enable()``, which calls it) fails with ``AttributeError: module 'torch'
has no attribute 'xla'``. The XLA accelerator registers this module as ``torch.xla`` when it sets
up its device (:func:`register`).

The random state of an XLA device is torch_xla's running seed (an ``int``):
:func:`get_rng_state` and :func:`set_rng_state` are ``torch_xla.core.xla_model.get_rng_state`` and
``set_rng_state`` on the device named. Setting the seed read before a block makes the block's
random operations (dropout) draw again what they drew after that read, which is what the
recomputation needs to rebuild the same activations.

Only what torch's device-generic code calls is here: ``_initialized``, :func:`is_available`,
:func:`device_count`, :func:`current_device`, :class:`device`, :func:`get_rng_state` and
:func:`set_rng_state`.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Optional, Union

import torch

#: Read by ``torch.utils.checkpoint`` before it saves a device's random state: the module is
#: registered only once the accelerator started the runtime, so there is always a state to save.
_initialized = True

_DeviceLike = Union[int, str, torch.device, None]
_REGISTERING = threading.Lock()


class _Selected(threading.local):
    """The device index a :class:`device` block selected on this thread (spawn replicas are threads)."""

    index: Optional[int] = None


_SELECTED = _Selected()


def is_available() -> bool:
    """Whether an XLA device can be used: always, once this module is registered (by the accelerator's setup)."""
    return True


def device_count() -> int:
    """How many devices ``torch.device("xla", i)`` can name in this process.

    1 under SPMD (one virtual device, ``xla:0``, stands for the mesh); otherwise torch_xla's count
    of the process's addressable devices (``torch_xla.device_count()``).
    """
    import torch_xla
    import torch_xla.runtime as xr

    return 1 if xr.is_spmd() else int(torch_xla.device_count())


def current_device() -> int:
    """The index selected by the innermost :class:`device` block on this thread, else the thread's default device's."""
    if _SELECTED.index is not None:
        return _SELECTED.index
    import torch_xla

    return int(torch_xla.device().index or 0)


class device:
    """Select ``device`` for :func:`get_rng_state` and :func:`set_rng_state` called without one, inside the block.

    Args:
        device: an index, ``"xla:<i>"`` or ``torch.device("xla", i)``; ``None`` keeps the current selection.

    Raises:
        ValueError: ``device`` names a device of another type than ``xla``.
    """

    def __init__(self, device: _DeviceLike) -> None:
        self.index = None if device is None else _index(device)
        self._outer: Optional[int] = None

    def __enter__(self) -> None:
        self._outer = _SELECTED.index
        if self.index is not None:
            _SELECTED.index = self.index

    def __exit__(self, *exc_info: object) -> None:
        _SELECTED.index = self._outer


def get_rng_state(device: _DeviceLike = None) -> int:
    """The running seed of XLA device ``device`` (``xm.get_rng_state``); default: the selected or default device.

    Raises:
        ValueError: ``device`` names a device of another type than ``xla``.
    """
    import torch_xla.core.xla_model as xm

    return int(xm.get_rng_state(_name(device)))


def set_rng_state(new_state: Any, device: _DeviceLike = None) -> None:
    """Set the running seed of XLA device ``device`` (``xm.set_rng_state``) to ``new_state``, an ``int``
    :func:`get_rng_state` returned (a one-element integer tensor is accepted too).

    Raises:
        TypeError: ``new_state`` is not an integer.
        ValueError: ``device`` names a device of another type than ``xla``.
    """
    import torch_xla.core.xla_model as xm

    if isinstance(new_state, torch.Tensor) and new_state.numel() == 1 and not new_state.is_floating_point():
        new_state = int(new_state.item())
    if isinstance(new_state, bool) or not isinstance(new_state, int):
        raise TypeError(f"The random state of an XLA device is an int (torch_xla's seed), got {new_state!r}.")
    xm.set_rng_state(new_state, _name(device))


def register() -> None:
    """Register this module as ``torch.xla`` (torch's private ``torch._register_device_module``), once per process.

    Does nothing when ``torch.xla`` exists already (registered earlier, or by a torch_xla release
    that registers its own). The registration lasts for the process: torch has no way to undo it.
    """
    from xla_plugins.runtime import _torch_xla_contract

    with _REGISTERING:
        if not hasattr(torch, "xla"):
            _torch_xla_contract.register_device_module("xla", sys.modules[__name__])


def _index(device: Union[int, str, torch.device]) -> int:
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    parsed = torch.device(device) if isinstance(device, str) else device
    if not isinstance(parsed, torch.device) or parsed.type != "xla":
        raise ValueError(f"Expected an XLA device (an index, 'xla:<i>' or torch.device('xla', i)), got {device!r}.")
    return parsed.index if parsed.index is not None else current_device()


def _name(device: _DeviceLike) -> Optional[str]:
    """``"xla:<i>"`` for ``device`` (or the selected device); ``None`` for the thread's default device."""
    if device is None:
        return None if _SELECTED.index is None else f"xla:{_SELECTED.index}"
    return f"xla:{_index(device)}"
