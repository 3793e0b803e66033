"""The TorchTPU accelerator: the native ``"tpu"`` device (TorchTPU, or the stand-in), for Trainer and Fabric."""

from __future__ import annotations

from typing import Any, Union

import torch
from lightning.fabric.utilities.device_parser import _check_data_type
from lightning.fabric.utilities.types import _DEVICE
from lightning.pytorch.accelerators.accelerator import Accelerator
from typing_extensions import override

from torchtpu_plugins import _device


class TorchTPUAccelerator(Accelerator):
    """Accelerator for TorchTPU's ``"tpu"`` device (PrivateUse1), one device per process.

    Serves both ``lightning.Trainer`` and ``lightning.Fabric``. Availability and counts come from
    ``torch.accelerator`` (TorchTPU refuses the legacy ``torch.tpu.*`` from user code on torch >= 2.11);
    nothing here starts the device before a run does.

    Raises:
        RuntimeError: no ``"tpu"`` device is registered in this process (the message says why:
            torch_tpu missing, no TPU attached, or the stand-in off).
    """

    def __init__(self) -> None:
        reason = _device.unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"accelerator 'tpu' (TorchTPU) is not available: {reason}")
        super().__init__()

    @override
    def setup_device(self, device: torch.device) -> None:
        """Check that the run's device is a ``"tpu"`` device.

        Raises:
            ValueError: ``device`` is of another type.
        """
        if device.type != _device.DEVICE_TYPE:
            raise ValueError(f"the TorchTPU accelerator runs on 'tpu' devices, got {device}")

    @override
    def teardown(self) -> None:
        pass

    @staticmethod
    @override
    def parse_devices(devices: Union[int, str, list[int]]) -> int:
        """The number of devices of ``devices``: an int >= 1, ``"auto"``/``-1`` (all), or a list of indices.

        Raises:
            ValueError: not one of those, or more devices than ``torch.accelerator.device_count()``.
        """
        _check_data_type(devices)
        available = _device.device_count()
        if isinstance(devices, str):
            devices = -1 if devices.strip() in ("auto", "-1") else int(devices.strip().rstrip(","))
        count = len(devices) if isinstance(devices, list) else devices
        if count == -1:
            count = available
        if not 1 <= count <= available:
            raise ValueError(
                f"devices={devices!r} is not valid for TorchTPU: valid are 1 to {available} (the 'tpu' devices"
                " torch.accelerator reports), -1 or 'auto'"
            )
        return count

    @staticmethod
    @override
    def get_parallel_devices(devices: Union[int, str, list[int]]) -> list[torch.device]:
        """One ``torch.device("tpu", i)`` per process of the run (each process binds its own, see the strategies)."""
        return [torch.device(_device.DEVICE_TYPE, index) for index in range(TorchTPUAccelerator.parse_devices(devices))]

    @staticmethod
    @override
    def auto_device_count() -> int:
        """``torch.accelerator.device_count()`` for ``"tpu"`` (0 when no device is registered)."""
        return _device.device_count()

    @staticmethod
    @override
    def is_available() -> bool:
        """Whether ``torch.accelerator`` names ``"tpu"`` in this process (never starts the device)."""
        return _device.unavailable_reason() is None

    @staticmethod
    @override
    def name() -> str:
        return _device.DEVICE_TYPE

    @classmethod
    @override
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        """Registered through trainer-plugins' catalogue (``_hooks``), not Lightning's registry."""

    @override
    def get_device_stats(self, device: _DEVICE) -> dict[str, Any]:
        """No statistics yet: TorchTPU's memory counters are not read (not verified on TPU)."""
        return {}
