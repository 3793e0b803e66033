"""The TorchTPU accelerator: the native ``"tpu"`` device (TorchTPU, or the stand-in), for Trainer and Fabric.

A TorchTPU worker sees one chip. Where an outside launcher started the processes, the devices of this
host are the launcher's processes on it: ``LOCAL_WORLD_SIZE`` (torchrun, Ray Train), or under srun
(Lightning's ``SLURMEnvironment.detect()``) ``SLURM_NTASKS_PER_NODE``. So ``devices="auto"`` means
that count and an explicit count is checked against it; Lightning's cluster environment then checks
``devices * num_nodes`` against the launcher's world size. Without an outside launcher the count is
``torch.accelerator.device_count()``.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Union

import torch
from lightning.fabric.utilities.device_parser import _check_data_type
from lightning.fabric.utilities.types import _DEVICE
from lightning.pytorch.accelerators.accelerator import Accelerator
from typing_extensions import override

from torchtpu_plugins.runtime import _probes
from trainer_plugins import _variables

#: The variable through which torchrun and Ray Train give each worker the number of workers on its host.
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
#: srun's count of tasks on each node (``--ntasks-per-node``), which Lightning's ``SLURMEnvironment`` checks.
SLURM_NTASKS_PER_NODE = "SLURM_NTASKS_PER_NODE"


def launcher_local_world_size() -> Optional[tuple[int, str]]:
    """(the processes an outside launcher started on this host, the variable read), or ``None`` without one.

    ``LOCAL_WORLD_SIZE`` where set (torchrun, Ray Train), else ``SLURM_NTASKS_PER_NODE`` where
    Lightning's ``SLURMEnvironment.detect()`` says srun started the processes.

    Raises:
        ValueError: the variable is not an integer >= 1.
    """
    from lightning.fabric.plugins.environments import SLURMEnvironment

    name = LOCAL_WORLD_SIZE if LOCAL_WORLD_SIZE in os.environ else None
    if name is None and SLURMEnvironment.detect() and SLURM_NTASKS_PER_NODE in os.environ:
        name = SLURM_NTASKS_PER_NODE
    if name is None:
        return None
    return _variables.process_count_from_environment(name, 1), name


def _devices_here() -> tuple[int, str]:
    """(the devices of this host, where that number comes from), see the module's docstring; 0 without a device."""
    launched = launcher_local_world_size()
    count = _probes.device_count()
    if launched is not None and count > 0:
        return launched[0], f"the processes the launcher started on this host, {launched[1]}={launched[0]}"
    return count, "the 'tpu' devices torch.accelerator reports"


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
        reason = _probes.unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"accelerator 'tpu' (TorchTPU) is not available: {reason}")
        super().__init__()

    @override
    def setup_device(self, device: torch.device) -> None:
        """Check that the run's device is a ``"tpu"`` device.

        Raises:
            ValueError: ``device`` is of another type.
        """
        if device.type != _probes.DEVICE_TYPE:
            raise ValueError(f"the TorchTPU accelerator runs on 'tpu' devices, got {device}")

    @override
    def teardown(self) -> None:
        pass

    @staticmethod
    @override
    def parse_devices(devices: Union[int, str, list[int]]) -> int:
        """The number of devices of ``devices``: an int >= 1, ``"auto"``/``-1`` (all), or a list of indices.

        All devices are the outside launcher's processes on this host where one started them (one chip
        a worker: :func:`launcher_local_world_size`), else ``torch.accelerator.device_count()``.

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
        return [torch.device(_probes.DEVICE_TYPE, index) for index in range(TorchTPUAccelerator.parse_devices(devices))]

    @staticmethod
    @override
    def auto_device_count() -> int:
        """The outside launcher's processes on this host (:func:`launcher_local_world_size`), else
        ``torch.accelerator.device_count()`` (0: no device).

        Raises:
            ValueError: the launcher's variable is not an integer >= 1.
        """
        return _devices_here()[0]

    @staticmethod
    @override
    def is_available() -> bool:
        """Whether ``torch.accelerator`` names ``"tpu"`` in this process (never starts the device)."""
        return _probes.unavailable_reason() is None

    @staticmethod
    @override
    def name() -> str:
        return _probes.DEVICE_TYPE

    @classmethod
    @override
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        """Registered through trainer-plugins' catalogue (``_hooks``), not Lightning's registry."""

    @override
    def get_device_stats(self, device: _DEVICE) -> dict[str, Any]:
        """No statistics yet: TorchTPU's memory counters are not read (not verified on TPU)."""
        return {}
