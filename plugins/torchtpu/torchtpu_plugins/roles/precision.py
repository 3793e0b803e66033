"""Precision plugins on the ``"tpu"`` device: Lightning's own, with autocast told the device.

Lightning 2.6 builds ``bf16-mixed`` for an accelerator it does not know with ``device="cuda"``, which
leaves a ``"tpu"`` run in float32 without a word; here ``torch.autocast`` gets ``device_type="tpu"``
(bfloat16, as TorchTPU's autocast prefers). ``bf16-true`` and ``32-true`` are Lightning's
``HalfPrecision`` and ``Precision``: no device enters them.
"""

from __future__ import annotations

from typing import Any

from torchtpu_plugins.runtime import _probes

#: The precision strings the TorchTPU accelerator runs.
PRECISIONS = ("32-true", "bf16-true", "bf16-mixed")
_MODULES = {"trainer": "lightning.pytorch.plugins.precision", "fabric": "lightning.fabric.plugins.precision"}


def build(precision: str, precision_input: Any, api: str, package: str = "lightning") -> Any:
    """The Lightning precision plugin of ``precision`` for a ``"tpu"`` run of ``api``.

    Args:
        precision: Lightning's normalised precision string.
        precision_input: the value as the user passed it (for the error message).
        api: ``"trainer"`` or ``"fabric"``.
        package: the Lightning packaging of the run (``"lightning"`` or ``"pytorch_lightning"``).

    Raises:
        ValueError: ``precision`` is not one of :data:`PRECISIONS`.
    """
    from trainer_plugins import resolve_in

    def lightning_class(name: str) -> Any:
        return resolve_in(f"{_MODULES[api]}:{name}", package)

    if precision == "32-true":
        return lightning_class("Precision")()
    if precision == "bf16-true":
        return lightning_class("HalfPrecision")("bf16-true")
    if precision == "bf16-mixed":
        return lightning_class("MixedPrecision")("bf16-mixed", device=_probes.DEVICE_TYPE)
    raise ValueError(
        f"precision={precision_input!r} is not supported on accelerator 'tpu' (TorchTPU);"
        f" valid: {', '.join(PRECISIONS)}"
    )
