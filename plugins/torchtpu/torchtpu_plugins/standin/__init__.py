"""A CPU-backed stand-in for TorchTPU's ``"tpu"`` device: development mode, not verified on TPU.

:func:`install` (run by ``torchtpu_plugins._autoload`` when ``TORCHTPU_PLUGINS_DEVICE=cpu``) makes
PrivateUse1 the ``"tpu"`` device with its memory in host RAM: tensors report ``device.type == "tpu"``,
every op runs torch's CPU kernel on zero-copy views (:mod:`._kernels`), ``torch.autocast("tpu")``
casts like TorchTPU's (:mod:`._autocast`), ``torch.accelerator`` reports ``"tpu"`` with
``TORCHTPU_PLUGINS_DEVICE_COUNT`` devices (default 1; each process is bound to ``tpu:0``), and the
``"tpu_dist"`` process group runs collectives over gloo (:mod:`._distributed`).
"""

from __future__ import annotations

from typing import Any

import torch

from torchtpu_plugins.runtime import _torch_contract

#: The device name TorchTPU gives PrivateUse1.
DEVICE = "tpu"
_registrations: list[Any] = []  # torch.library.Library objects: a registration lives as long as its object


def installed() -> bool:
    """Whether this process runs the stand-in (PrivateUse1 is ``"tpu"`` with this package's device module)."""
    from torchtpu_plugins.standin import _device_module

    return bool(_registrations) and getattr(torch, DEVICE, None) is _device_module


def install() -> None:
    """Register the stand-in ``"tpu"`` device in this process; a second call does nothing.

    Raises:
        RuntimeError: another backend holds PrivateUse1 already (named, with how to keep it out), or
            the installed torch lacks a name of :data:`torchtpu_plugins.runtime._torch_contract.NAMES`.
    """
    if installed():
        return
    holder = _torch_contract.resolve("_C._get_privateuse1_backend_name")()
    if holder != "privateuseone" or _registrations:
        raise RuntimeError(
            f"the TorchTPU stand-in device cannot start: PrivateUse1 is held by the backend {holder!r} already "
            f"(TorchTPU itself, or another out-of-tree device). Unset TORCHTPU_PLUGINS_DEVICE to use that backend, "
            f"or keep it from loading (uninstall it, or TORCH_DEVICE_BACKEND_AUTOLOAD=0 with torchtpu_plugins"
            f".standin.install() called after import torch)"
        )
    _torch_contract.check()
    from torchtpu_plugins.standin import _autocast, _device_module, _distributed, _guards, _kernels

    setup = _torch_contract.resolve("utils.backend_registration._setup_privateuseone_for_python_backend")
    hooks = _torch_contract.resolve("_C._acc.PrivateUse1Hooks")

    class _Hooks(hooks):  # type: ignore[misc, valid-type]
        def is_available(self) -> bool:
            return True

        def has_primary_context(self, device_index: int) -> bool:
            return True

        def is_built(self) -> bool:
            return True

    setup(rename=DEVICE, backend_module=_device_module, hook=_Hooks())
    _registrations.extend(_kernels.register())
    _registrations.append(_autocast.register())
    _guards.install()
    _distributed.register()
