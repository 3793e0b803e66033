"""Whether a ``"tpu"`` device is there, read from ``torch.accelerator`` without starting one.

TorchTPU loads at ``import torch`` (torch's backend autoload) and registers the ``"tpu"`` device only
where a TPU is attached; the stand-in (``TORCHTPU_PLUGINS_DEVICE=cpu``) registers it on any machine.
Either way ``torch.accelerator.current_accelerator()`` then names ``"tpu"``. Nothing here calls the
legacy ``torch.tpu.*`` functions (TorchTPU refuses them from user code on torch >= 2.11) or creates a
tensor, so no probe initialises libtpu (which, without a TPU, queries the cloud metadata server).
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import entry_points
from typing import Optional

#: The device type TorchTPU gives PrivateUse1.
DEVICE_TYPE = "tpu"


#: The ``torch.backends`` entry point of Google's torch-tpu (another package also imports as ``torch_tpu``).
TORCH_TPU_LOADER = "torch_tpu._loader:load"


def torch_tpu_installed() -> bool:
    """Whether Google's torch-tpu is installed (its ``torch.backends`` entry point), read from metadata only."""
    return any(point.value == TORCH_TPU_LOADER for point in entry_points(group="torch.backends"))


def probably_available() -> bool:
    """Whether a ``"tpu"`` device can run here, answered without importing torch when it is not imported yet.

    With torch imported, the answer of :func:`unavailable_reason`. Before (``trainer-plugins list``, a probe
    run in a fresh process), from files: the stand-in's variable set, or torch-tpu installed on a host with
    a TPU chip on its PCI bus and its ``/dev/vfio`` group (TorchTPU's own condition to start,
    :func:`torchtpu_plugins.runtime._pci.tpu_chips`). With
    ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` torch loads neither, so the answer is false.
    """
    if "torch" in sys.modules:
        return unavailable_reason() is None
    from torchtpu_plugins._autoload import VALUES, VARIABLE

    if os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "0":
        return False
    if os.environ.get(VARIABLE) in VALUES:
        return True
    from torchtpu_plugins.runtime import _pci

    return torch_tpu_installed() and bool(_pci.tpu_chips())


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
    from torchtpu_plugins.runtime import _pci

    if not torch_tpu_installed():
        return (
            f"torch reports {seen}: torch-tpu (TorchTPU) is not installed and the stand-in device is off"
            f" (set {VARIABLE}=cpu before `import torch` for the CPU-backed stand-in)"
        )
    if not _pci.tpu_chips():
        return (
            f"torch reports {seen}: torch-tpu is installed, but this host has no TPU chip (none on the PCI bus"
            f" with vendor {_pci.TPU_PCI_VENDOR} and its /dev/vfio group), so it registered no 'tpu' device"
        )
    if os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "0":
        return f"torch reports {seen}: TORCH_DEVICE_BACKEND_AUTOLOAD=0 kept torch from loading torch-tpu"
    return f"torch reports {seen}, although torch-tpu is installed and TPU chips are attached"


def device_count() -> int:
    """The number of ``"tpu"`` devices ``torch.accelerator`` reports (0 when none is registered)."""
    if unavailable_reason() is not None:
        return 0
    import torch

    return torch.accelerator.device_count()
