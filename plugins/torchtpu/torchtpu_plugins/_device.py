"""Whether a ``"tpu"`` device is there, read from ``torch.accelerator`` without starting one.

TorchTPU loads at ``import torch`` (torch's backend autoload) and registers the ``"tpu"`` device only
where a TPU is attached; the stand-in (``TORCHTPU_PLUGINS_DEVICE=cpu``) registers it on any machine.
Either way ``torch.accelerator.current_accelerator()`` then names ``"tpu"``. Nothing here calls the
legacy ``torch.tpu.*`` functions (TorchTPU refuses them from user code on torch >= 2.11) or creates a
tensor, so no probe initialises libtpu (which, without a TPU, queries the cloud metadata server).
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
from typing import Optional

#: The device type TorchTPU gives PrivateUse1.
DEVICE_TYPE = "tpu"
#: The PCI vendor id of Google's TPU chips, which TorchTPU looks for (with a ``/dev/vfio`` group) before it starts.
TPU_PCI_VENDOR = "0x1ae0"


def _tpu_attached() -> bool:
    """Whether a TPU chip is on this host's PCI bus and a VFIO group exists (files only, nothing starts)."""
    for path in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(path) as file:
                if file.read().strip() == TPU_PCI_VENDOR:
                    return bool(glob.glob("/dev/vfio/[0-9]*"))
        except OSError:
            continue
    return False


def probably_available() -> bool:
    """Whether a ``"tpu"`` device can run here, answered without importing torch when it is not imported yet.

    With torch imported, the answer of :func:`unavailable_reason`. Before (``trainer-plugins list``, a probe
    run in a fresh process), from files: the stand-in's variable set, or torch_tpu installed on a host with
    a TPU chip on its PCI bus and a ``/dev/vfio`` group (TorchTPU's own conditions to start). With
    ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` torch loads neither, so the answer is false.
    """
    if "torch" in sys.modules:
        return unavailable_reason() is None
    from torchtpu_plugins._autoload import VALUES, VARIABLE

    if os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "0":
        return False
    if os.environ.get(VARIABLE) in VALUES:
        return True
    return importlib.util.find_spec("torch_tpu") is not None and _tpu_attached()


def unavailable_reason() -> Optional[str]:
    """Why no ``"tpu"`` device can run in this process, or ``None`` when one can.

    Imports torch (with TorchTPU installed, ``import torch`` loads it: seconds, no device start).
    """
    import torch

    accelerator = torch.accelerator.current_accelerator()
    if accelerator is not None and accelerator.type == DEVICE_TYPE:
        return None
    from torchtpu_plugins._autoload import VARIABLE

    seen = "no accelerator" if accelerator is None else f"the accelerator {accelerator.type!r}"
    if importlib.util.find_spec("torch_tpu") is None:
        return (
            f"torch reports {seen}: torch_tpu (TorchTPU) is not installed and the stand-in device is off"
            f" (set {VARIABLE}=cpu before `import torch` for the CPU-backed stand-in)"
        )
    return (
        f"torch reports {seen}: torch_tpu is installed but registered no 'tpu' device (no TPU attached, or"
        " TORCH_DEVICE_BACKEND_AUTOLOAD=0 kept it from loading)"
    )


def device_count() -> int:
    """The number of ``"tpu"`` devices ``torch.accelerator`` reports (0 when none is registered)."""
    if unavailable_reason() is not None:
        return 0
    import torch

    return torch.accelerator.device_count()
