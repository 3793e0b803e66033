"""The TorchTPU accelerator: the native ``"tpu"`` device (TorchTPU, or the stand-in), for Trainer and Fabric.

A TorchTPU worker sees one chip. Where an outside launcher started the processes (torchrun, Ray
Train: ``LOCAL_WORLD_SIZE`` is set), the devices of this host are the launcher's processes on it, so
``devices="auto"`` means ``LOCAL_WORLD_SIZE`` and an explicit count is checked against it; Lightning's
cluster environment then checks ``devices * num_nodes`` against the launcher's ``WORLD_SIZE``.
Without an outside launcher the count is ``torch.accelerator.device_count()``.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Union

import torch
from lightning.fabric.utilities.device_parser import _check_data_type
from lightning.fabric.utilities.types import _DEVICE
from lightning.pytorch.accelerators.accelerator import Accelerator
from typing_extensions import override

from torchtpu_plugins import _device


#: The variable through which torchrun and Ray Train give each worker the number of workers on its host.
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"


def launcher_local_world_size() -> Optional[int]:
    """The processes an outside launcher started on this host (``LOCAL_WORLD_SIZE``), or ``None`` where unset.

    Raises:
        ValueError: ``LOCAL_WORLD_SIZE`` is not an integer >= 1.
    """
    value = os.environ.get(LOCAL_WORLD_SIZE)
    if value is None:
        return None
    if not value.strip().isdigit() or int(value) < 1:
        raise ValueError(f"{LOCAL_WORLD_SIZE}={value!r} is not a process count: valid are integers >= 1 (torchrun sets it)")
    return int(value)


def _devices_here() -> tuple[int, str]:
    """(the devices of this host, where that number comes from), see the module's docstring; 0 without a device."""
    launched = launcher_local_world_size()
    if launched is not None and _device.device_count() > 0:
        return launched, f"the processes the launcher started on this host, {LOCAL_WORLD_SIZE}={launched}"
    return _device.device_count(), "the 'tpu' devices torch.accelerator reports"


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

        All devices are ``LOCAL_WORLD_SIZE`` where an outside launcher sets it (one chip a worker), else
        ``torch.accelerator.device_count()``.

        Raises:
            ValueError: not one of those, or more devices than that count (the message says which it is).
        """
        _check_data_type(devices)
        available, source = _devices_here()
        if isinstance(devices, str):
            devices = -1 if devices.strip() in ("auto", "-1") else int(devices.strip().rstrip(","))
        count = len(devices) if isinstance(devices, list) else devices
        if count == -1:
            count = available
        if not 1 <= count <= available:
            raise ValueError(
                f"devices={devices!r} is not valid for TorchTPU: valid are 1 to {available} ({source}), -1 or 'auto'"
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
        """``LOCAL_WORLD_SIZE`` under an outside launcher, else ``torch.accelerator.device_count()`` (0: no device).

        Raises:
            ValueError: ``LOCAL_WORLD_SIZE`` is set but not an integer >= 1.
        """
        return _devices_here()[0]

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
