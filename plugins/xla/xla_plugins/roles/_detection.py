"""Auto-detection: whether ``accelerator="auto"`` should choose XLA, without starting a runtime."""

from __future__ import annotations

import os
import warnings

from xla_plugins.runtime import _torch_xla_contract
from xla_plugins.runtime._probes import importable


def auto_candidate() -> bool:
    """Whether ``accelerator="auto"`` should choose XLA, without starting a runtime.

    True when torch_xla is installed and an XLA-only device is selected and attached, or attached
    while ``PJRT_DEVICE`` is unset: a TPU (libtpu installed and torch_xla's probe finds a chip) or,
    for ``PJRT_DEVICE=CUDA``, a CUDA device. A CPU-only machine never imports torch_xla here.

    When ``PJRT_DEVICE`` is set (or empty) but names no device attached here, ``"auto"`` does not
    choose XLA (plain Lightning would run on the CPU; so do we) and one ``UserWarning`` names
    ``PJRT_DEVICE``; an explicit ``accelerator="tpu"`` still reports the runtime's own error.
    """
    chosen, reason, warn = auto_decision()
    if warn:
        warnings.warn(reason, UserWarning, stacklevel=2)
    return chosen


def auto_decision() -> tuple[bool, str, bool]:
    """``(chosen, reason, worth a warning)``: :func:`auto_candidate`'s answer and why, in one sentence.

    ``trainer-plugins doctor`` shows the reason (see :mod:`xla_plugins._doctor`).
    """
    if not importable("torch_xla"):
        return False, "torch_xla is not installed", False
    raw = os.environ.get("PJRT_DEVICE")
    if raw is None:
        if _tpu_attached():
            return True, "PJRT_DEVICE is unset and a TPU is attached", False
        return (
            False,
            "PJRT_DEVICE is unset and no TPU is attached: accelerator='auto' leaves torch_xla's CPU device to"
            " Lightning's own CPU accelerator; pass accelerator='tpu' (or 'xla') to run on it",
            False,
        )
    selected = raw.strip().upper()
    if selected == "CPU":
        return (
            False,
            "PJRT_DEVICE=CPU: accelerator='auto' never picks torch_xla's CPU device (by policy: plain Lightning"
            " runs such a script on its own CPU accelerator); pass accelerator='tpu' (or 'xla') to run on it",
            False,
        )
    attached = _ATTACHED.get(selected)
    if attached is not None and attached():
        return True, f"PJRT_DEVICE={raw!r} names an attached device type", False
    what = (
        "is empty"
        if not selected
        else f"names {'no device type torch_xla knows' if attached is None else 'a device type not attached here'}"
    )
    return (
        False,
        f"PJRT_DEVICE={raw!r} {what}, so accelerator='auto' does not choose XLA and the run uses another"
        " accelerator (the CPU if nothing else is attached). Set PJRT_DEVICE to an attached device type"
        " (TPU, CPU, ...) or unset it; accelerator='tpu' reports the runtime's own error.",
        True,
    )


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
