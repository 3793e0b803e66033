"""What ``trainer-plugins doctor`` shows for TorchTPU: versions, the stand-in, the ``"tpu"`` devices seen."""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version

from torchtpu_plugins import _autoload, _device


def _version_or(distribution: str) -> str:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "not installed"


def describe() -> dict[str, object]:
    """Versions of torch-tpu, libtpu and torch, torch's backend autoload switch, whether the stand-in is on,
    and the ``"tpu"`` devices torch reports.

    Reads ``torch.accelerator`` only (never the legacy ``torch.tpu.*``, never a tensor): no device starts.
    """
    info: dict[str, object] = {
        "torch-tpu": _version_or("torch-tpu"),
        "libtpu": _version_or("libtpu"),
        "torch": _version_or("torch"),
        # read once by torch at `import torch`: set it before, or not at all
        "TORCH_DEVICE_BACKEND_AUTOLOAD": os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "unset (backends load)"),
        "stand-in device": f"{_autoload.VARIABLE}={os.environ[_autoload.VARIABLE]}"
        if os.environ.get(_autoload.VARIABLE)
        else f"off ({_autoload.VARIABLE} unset)",
    }
    reason = _device.unavailable_reason()
    info["'tpu' devices"] = _device.device_count() if reason is None else f"none ({reason})"
    return info
