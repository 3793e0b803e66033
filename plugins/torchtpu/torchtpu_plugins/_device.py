"""Whether a ``"tpu"`` device is there, read from ``torch.accelerator`` without starting one.

TorchTPU loads at ``import torch`` (torch's backend autoload) and registers the ``"tpu"`` device only
where a TPU is attached; the stand-in (``TORCHTPU_PLUGINS_DEVICE=cpu``) registers it on any machine.
Either way ``torch.accelerator.current_accelerator()`` then names ``"tpu"``. Nothing here calls the
legacy ``torch.tpu.*`` functions (TorchTPU refuses them from user code on torch >= 2.11) or creates a
tensor, so no probe initialises libtpu (which, without a TPU, queries the cloud metadata server).
"""

from __future__ import annotations

import importlib.util
from typing import Optional

#: The device type TorchTPU gives PrivateUse1.
DEVICE_TYPE = "tpu"


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
