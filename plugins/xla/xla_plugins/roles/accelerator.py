"""The XLA accelerator: any PJRT device torch_xla can drive (TPU, CPU, CUDA, Neuron, ...)."""

from __future__ import annotations

import os
from typing import Any, Union

import torch
from lightning.fabric.utilities.rank_zero import rank_zero_deprecation
from lightning.fabric.utilities.types import _DEVICE
from lightning.pytorch.accelerators.xla import XLAAccelerator as _LightningXLAAccelerator
from typing_extensions import override

from xla_plugins.runtime import _probes

_MiB = 2**20


class XLAAccelerator(_LightningXLAAccelerator):
    """Accelerator for XLA devices through torch_xla's PJRT runtime (experimental upstream).

    Serves both ``lightning.Trainer`` and ``lightning.Fabric``. It subclasses Lightning's own
    ``XLAAccelerator`` so that Lightning's internal XLA handling (``no_grad`` evaluation loops,
    Fabric's joint model/optimizer setup) applies, and replaces its device logic: the device count
    comes from the PJRT runtime of whatever ``PJRT_DEVICE`` is active, not from TPU-only probes.

    Raises:
        ModuleNotFoundError: torch_xla is not installed (message names torch_xla and how to install it).
        RuntimeError: torch_xla is too old, the runtime is not PJRT, or the PJRT device cannot start.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _probes.require_torch_xla()
        super().__init__(*args, **kwargs)
        if _probes.device_count() < 1:
            raise RuntimeError(f"PJRT_DEVICE={os.environ.get('PJRT_DEVICE')} reports no devices.")

    @override
    def setup_device(self, device: torch.device) -> None:
        """Start the PJRT runtime on ``device`` at the beginning of a run.

        torch_xla reads its configuration once, when the runtime starts and the first
        floating-point tensor is created. Doing both here, before the precision plugin sets the
        legacy ``XLA_USE_*`` variable, means that variable does not change how torch_xla lowers the
        model: the dtypes PyTorch reports are the dtypes that run, and torch_xla >= 2.6 prints no
        deprecation notice for it. The persistent compilation cache named by
        ``XLA_PLUGINS_COMPILE_CACHE`` is turned on first (:mod:`xla_plugins.compilation.compile_cache`). Then
        :mod:`xla_plugins.runtime.device_module` is registered as ``torch.xla``, so that
        ``torch.utils.checkpoint`` can save and restore the XLA random state (torch_xla registers none).

        Raises:
            ValueError: ``XLA_PLUGINS_COMPILE_CACHE`` names something that is not a folder.
            RuntimeError: ``XLA_PLUGINS_COMPILE_CACHE`` is set after the process compiled a graph.
        """
        from xla_plugins.compilation import compile_cache
        from xla_plugins.runtime import device_module

        compile_cache.enable(_probes.device_type())  # before the first graph: torch_xla reads it once
        torch.zeros(1, device=device)
        _check_autograd_engine(device)
        device_module.register()

    @override
    def setup(self, trainer: Any) -> None:
        """Let ``trainer`` read logged metrics at its readers' cadence (see :mod:`xla_plugins.loop.metrics`),
        redraw Lightning's default progress bar by the clock (see :mod:`xla_plugins.loop.progress`), and
        trace no division by one into each training step (see :mod:`xla_plugins.loop.closure`), and
        count compilations and host reads per phase of the loop (see :mod:`xla_plugins.compilation.compile_monitor`).

        A LightningModule compiled with a ``torch.compile`` backend that cannot compile XLA tensors
        is refused first (:func:`xla_plugins.compilation._compile_backend.check_compile_backend`).

        Raises:
            ValueError: ``XLA_PLUGINS_METRIC_READS``, ``XLA_PLUGINS_METRIC_READ_INTERVAL``,
                ``XLA_PLUGINS_RECOMPILES`` or the strategy's ``recompiles`` is invalid.
            RuntimeError: the module was compiled with ``backend="inductor"`` (torch's default).
        """
        from xla_plugins.compilation import compile_monitor
        from xla_plugins.compilation._compile_backend import check_compile_backend
        from xla_plugins.loop import closure, metrics, progress

        check_compile_backend(trainer.lightning_module)

        closure.install(trainer)
        compile_monitor.install(trainer)
        if metrics.install(trainer):
            progress.install(trainer)

    @staticmethod
    @override
    def parse_devices(devices: Union[int, str, list[int]]) -> Union[int, list[int]]:
        """Validate ``devices`` for XLA (SPEC "Devices"); N is the runtime's device count.

        Args:
            devices: ``"auto"`` (all N), ``1``, ``N``, ``[i]`` with ``0 <= i < N``, or a string of
                one of them (``"8"`` -> 8, ``"2,"`` -> ``[2]``). Lightning usually resolves
                ``"auto"`` itself, through :meth:`auto_device_count`, before calling this.

        Returns:
            The number of devices, or a one-element list naming the device index.

        Raises:
            TypeError: ``devices`` is not an int, a str or a sequence of ints (``None``, ``True``, ...).
            ValueError: any other value; the message names it and lists ``'auto', 1, N or [0-(N-1)]``.
        """
        if not _is_devices_value(devices):
            raise TypeError(f"`devices` for XLA must be 'auto', an int, a string or a list of ints, got {devices!r}.")
        count = XLAAccelerator.auto_device_count()
        parsed: Union[int, list[int], None]
        if isinstance(devices, str):
            parsed = count if devices.strip() == "auto" else _parse_device_string(devices)
        else:
            parsed = list(devices) if isinstance(devices, (list, tuple)) else devices
        if isinstance(parsed, int) and parsed in (1, count):
            return parsed
        if isinstance(parsed, (list, tuple)) and len(parsed) == 1 and 0 <= parsed[0] < count:
            return list(parsed)
        shown = devices if parsed is None else parsed
        choices = _devices_choices(count)
        raise ValueError(f"`devices` can only be {choices} for XLA, got {shown!r}. {_count_source(count)}")

    @staticmethod
    @override
    def get_parallel_devices(devices: Union[int, str, list[int]]) -> list[torch.device]:
        """``torch.device("xla", i)`` for each device selected by ``devices`` (see :meth:`parse_devices`)."""
        parsed = XLAAccelerator.parse_devices(devices)
        indices = range(parsed) if isinstance(parsed, int) else parsed
        return [torch.device("xla", index) for index in indices]

    @staticmethod
    @override
    def auto_device_count() -> int:  # type: ignore[override]  # Lightning's caches the TPU-only count
        """The number of devices of this host for the active PJRT device type, from the PJRT runtime.

        Under torchrun with several processes on this host (``LOCAL_WORLD_SIZE`` above 1), that
        number instead: torch_xla gives each of torchrun's processes one chip
        (``pjrt.initialize_multiprocess``, which its ``xla://`` rendezvous calls), so the host's devices
        are torchrun's processes on it, as Lightning counts ``devices`` per node. With one process per
        host (the SPMD strategies), the runtime's count.

        Raises:
            ValueError: ``LOCAL_WORLD_SIZE`` is not an integer >= 1.
        """
        from xla_plugins.roles.environment import launcher_local_world_size

        local = launcher_local_world_size()
        if local is not None and local > 1:
            return local
        return _probes.device_count()

    @staticmethod
    @override
    def is_available() -> bool:  # type: ignore[override]  # Lightning's caches the TPU-only answer
        """Whether torch_xla is installed and its active PJRT device has at least one device."""
        return _probes.devices_usable()

    @override
    def get_device_stats(self, device: _DEVICE) -> dict[str, Any]:
        """Memory of ``device`` in MiB (2**20 bytes) from ``torch_xla.core.xla_model.get_memory_info``.

        Returns:
            ``{"memory.used (MiB)", "memory.free (MiB)", "memory.limit (MiB)"}`` plus
            ``"memory.peak (MiB)"`` where the runtime reports a peak; ``{}`` where the runtime has no
            memory statistics (the CPU PJRT client, for one).
        """
        import torch_xla.core.xla_model as xm

        try:
            info: dict[str, Any] = dict(xm.get_memory_info(torch.device(device)))
        except RuntimeError:  # "UNIMPLEMENTED: GetAllocatorStats is not supported"
            return {}
        if "kb_total" in info:  # torch_xla < 2.2 reported kilobytes
            info = {"bytes_limit": info["kb_total"] * 1024, "bytes_used": (info["kb_total"] - info["kb_free"]) * 1024}
        used, limit = float(info["bytes_used"]), float(info["bytes_limit"])
        stats = {
            "memory.used (MiB)": used / _MiB,
            "memory.free (MiB)": (limit - used) / _MiB,
            "memory.limit (MiB)": limit / _MiB,
        }
        if "peak_bytes_used" in info:
            stats["memory.peak (MiB)"] = float(info["peak_bytes_used"]) / _MiB
        return stats

    @staticmethod
    @override
    def name() -> str:
        return "xla"


class TPUAccelerator(XLAAccelerator):
    """Legacy name of :class:`XLAAccelerator`; warns that it is deprecated."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        rank_zero_deprecation(
            "`TPUAccelerator` is deprecated. Use `xla_plugins.XLAAccelerator` (accelerator='xla') instead."
        )
        super().__init__(*args, **kwargs)


def _check_autograd_engine(device: torch.device) -> None:
    """Fail clearly if torch's autograd engine cannot run backward passes on XLA in this process.

    torch sizes its autograd engine on the first backward pass of a process, from the devices it
    sees then. A backward pass run before torch_xla started its runtime (a CPU training earlier in
    the same process, or in the parent of a forked worker) leaves XLA out for good, and the next
    XLA backward pass fails with an internal assert. A one-element backward pass detects it.

    Raises:
        RuntimeError: the engine was started without XLA; says how to avoid it.
    """
    probe = torch.zeros(1, device=device, requires_grad=True)
    try:
        probe.sum().backward()
    except RuntimeError as error:
        if "device_ready_queues_" not in str(error):
            raise
        raise RuntimeError(
            "This process ran a backward pass before starting the XLA runtime (for example a CPU training), and"
            " torch's autograd engine cannot include XLA devices afterwards. Train on XLA in a fresh process, or"
            " touch the XLA device first (`torch.zeros(1, device=torch_xla.device())`) before any backward pass."
        ) from error


#: The variable that sets the number of devices of a PJRT device type, where torch_xla has one.
_COUNT_VARIABLES = {"CPU": "CPU_NUM_DEVICES", "CUDA": "GPU_NUM_DEVICES"}


def _devices_choices(count: int) -> str:
    """The valid ``devices`` values for ``count`` devices, each once.

    ``'auto', 1 or [0]`` for one device, ``'auto', 1, 8 or [0-7]`` for eight.
    """
    if count == 1:
        return "'auto', 1 or [0]"
    return f"'auto', 1, {count} or [0-{count - 1}]"


def _count_source(count: int) -> str:
    """Where the device count comes from and how to change it, for error messages."""
    device_type = _probes.device_type()
    chosen = (
        f"PJRT_DEVICE={device_type}"
        if not _probes.pjrt_device_defaulted()
        else f"PJRT_DEVICE is unset, so torch_xla chose {device_type}"
    )
    source = f"The PJRT runtime reports {count} {device_type} device(s) ({chosen})"
    variable = _COUNT_VARIABLES.get(device_type)
    if variable is not None:
        return f"{source}; set {variable}=<n> for n devices, or PJRT_DEVICE for another device type."
    return f"{source}: the devices attached to this host; set PJRT_DEVICE for another device type."


def _is_devices_value(devices: object) -> bool:
    """Whether ``devices`` has a type ``devices=`` accepts (bools are not ints here)."""
    if isinstance(devices, (list, tuple)):
        return all(type(index) is int for index in devices)
    return type(devices) in (int, str)


def _parse_device_string(devices: str) -> Union[int, list[int], None]:
    """``"8"`` -> 8, ``"0,1"`` -> [0, 1], ``"2,"`` -> [2]; ``None`` when the string is neither."""
    text = devices.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        return None
