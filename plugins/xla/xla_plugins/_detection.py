"""Auto-detection: whether ``accelerator="auto"`` should choose XLA, without starting a runtime."""

from __future__ import annotations

import os
import warnings

from xla_plugins import _torch_xla_contract
from xla_plugins._runtime import importable


def auto_candidate() -> bool:
    """Whether ``accelerator="auto"`` should choose XLA, without starting a runtime.

    True when torch_xla is installed and an XLA-only device is selected and attached, or attached
    while ``PJRT_DEVICE`` is unset: a TPU (libtpu installed and torch_xla's probe finds a chip) or,
    for ``PJRT_DEVICE=CUDA``, a CUDA device. A CPU-only machine never imports torch_xla here.

    When ``PJRT_DEVICE`` is set (or empty) but names no device attached here, ``"auto"`` does not
    choose XLA (plain Lightning would run on the CPU; so do we) and one ``UserWarning`` names
    ``PJRT_DEVICE``; an explicit ``accelerator="tpu"`` still reports the runtime's own error.
    """
    if not importable("torch_xla"):
        return False
    raw = os.environ.get("PJRT_DEVICE")
    if raw is None:
        return _tpu_attached()
    selected = raw.strip().upper()
    if selected == "CPU":
        return False
    attached = _ATTACHED.get(selected)
    if attached is not None and attached():
        return True
    what = (
        "is empty"
        if not selected
        else f"names {'no device type torch_xla knows' if attached is None else 'a device type not attached here'}"
    )
    warnings.warn(
        f"PJRT_DEVICE={raw!r} {what}, so accelerator='auto' does not choose XLA and the run uses another"
        " accelerator (the CPU if nothing else is attached). Set PJRT_DEVICE to an attached device type"
        " (TPU, CUDA, CPU) or unset it; accelerator='tpu' reports the runtime's own error.",
        UserWarning,
        stacklevel=2,
    )
    return False


def _tpu_attached() -> bool:
    """libtpu is installed and torch_xla's PCI probe finds a TPU chip (starts no runtime)."""
    if not importable("libtpu"):
        return False
    return _torch_xla_contract.num_available_tpu_chips() > 0


def _cuda_attached() -> bool:
    """torch sees a CUDA device (starts no XLA runtime)."""
    import torch

    return torch.cuda.device_count() > 0


#: Device types whose presence can be checked without starting a runtime.
_ATTACHED = {"TPU": _tpu_attached, "CUDA": _cuda_attached, "GPU": _cuda_attached}
