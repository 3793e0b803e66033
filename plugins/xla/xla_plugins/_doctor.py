"""What ``trainer-plugins doctor`` shows for XLA: versions, PJRT device, devices, what may differ between hosts.

Runs the checks of the runtime adapter (:mod:`xla_plugins.runtime._probes`) and reports their failures as
values, never as exceptions.
"""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version

from xla_plugins.roles._detection import auto_decision
from xla_plugins.runtime import _probes
from xla_plugins.runtime._world import RuntimeFigures


def describe() -> dict[str, object]:
    """What ``trainer-plugins doctor`` shows for XLA: versions, PJRT device, device count, runtime.

    Starts the PJRT runtime (in a probe process) to count devices; failures are reported as values.
    """
    from trainer_plugins import unsupported_versions

    info: dict[str, object] = {
        "torch": _version_or("torch"),
        "torch_xla": _version_or("torch_xla"),
        "PJRT_DEVICE": _pjrt_device_shown(),
    }
    for number, problem in enumerate(unsupported_versions("xla-plugins", ["lightning"]), start=1):
        info[f"unsupported version {number}"] = problem
    for number, problem in enumerate(environment_problems(), start=1):
        info[f"environment problem {number}"] = problem
    chosen, reason, _ = auto_decision()
    info["accelerator='auto'"] = f"{'picks XLA' if chosen else 'does not pick XLA'} ({reason})"
    raw = os.environ.get("PJRT_DEVICE")
    if (raw or "").strip().upper() in ("CUDA", "GPU") and _cuda_removed():
        info["error"] = (
            f"PJRT_DEVICE={raw}, but torch_xla {_version_or('torch_xla')} has no CUDA device (deprecated in"
            " torch_xla 2.8, removed in 2.9: pytorch/xla #9295, #9597); use PJRT_DEVICE=TPU or CPU, or the"
            " torch_xla 2.8 pair with its CUDA plugin: pip install 'xla-plugins[xla28]'"
        )
        return info
    if raw is not None and not raw.strip():
        info["error"] = "PJRT_DEVICE is set but empty, so torch_xla starts no device; unset it or name a device type"
        return info
    try:
        info["runtime"] = "PJRT" if _probes.require_torch_xla() is not None else "?"
        info["device type"] = _probes.device_type()
        figures = _probes.runtime_figures()
    except (ModuleNotFoundError, RuntimeError) as error:
        info["error"] = _probes.runtime_error_text(error)
        return info
    info["device count"] = figures.addressable_device_count
    info.update(host_view(figures))
    for number, warning in enumerate(host_warnings(figures), start=1):
        info[f"warning {number}"] = warning
    return info


def environment_problems() -> list[str]:
    """Installed distributions that break or slow down torch_xla here, each with its fix (``doctor``).

    * ``torch_tpu`` (Google's native TPU backend for torch) loads itself on ``import torch`` and
      replaces ``torch.compile``'s default backend: measured 18 s for ``import torch`` with
      torch_tpu 0.2.0 and no TPU present.
    * ``torchax`` from the package index next to a torch_xla wheel that ships its own ``torchax``
      package (torch_xla 2.9 does): the two write the same files, so whichever was installed last
      shadows the other, and uninstalling one deletes files of the other.

    Reads distribution metadata only (``importlib.metadata``); imports nothing.
    """
    from importlib.metadata import PackageNotFoundError, distribution

    problems = []
    installed = _version_or("torch_tpu")
    if installed != "not installed":
        problems.append(
            f"torch_tpu {installed} is installed: it loads itself on every `import torch` (18 s measured with"
            " torch_tpu 0.2.0 and no TPU) and replaces torch.compile's default backend; use a separate"
            " environment for torch_xla, or pip uninstall torch_tpu"
        )
    try:
        shipped = any(str(path).startswith("torchax/") for path in distribution("torch_xla").files or [])
        own = distribution("torchax")
    except PackageNotFoundError:
        return problems
    if shipped:
        problems.append(
            f"torchax {own.version} from the package index is installed next to torch_xla"
            f" {_version_or('torch_xla')}, whose wheel ships its own torchax package: the two write the same"
            " files and the last installed wins; pip uninstall torchax, then pip install --force-reinstall"
            f" --no-deps 'torch_xla=={_version_or('torch_xla')}' to restore torch_xla's copy"
        )
    return problems


def _cuda_removed() -> bool:
    """torch_xla 2.9 or newer is installed: it has no CUDA device (2.8 was the last with XLA:CUDA)."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version("torch_xla")).release[:2] >= (2, 9)
    except (PackageNotFoundError, InvalidVersion):
        return False


#: Distributions whose versions must be the same on every host of a slice (``doctor`` shows them).
SLICE_DISTRIBUTIONS = ("torch", "torch_xla", "libtpu", "lightning", "trainer-plugins", "xla-plugins")


def host_view(figures: RuntimeFigures) -> dict[str, object]:
    """The runtime's view of this host for ``doctor``: host index and count, local and global devices.

    A host is one process of a one-process-per-host run (how ``doctor``'s probe and the SPMD
    strategies start the runtime): host index ``process_index()``, host count ``process_count()``,
    local devices ``addressable_runtime_device_count()``, global ``global_runtime_device_count()``.
    """
    return {
        "host index": figures.process_index,
        "host count": figures.process_count,
        "local device count": figures.addressable_device_count,
        "global device count": figures.global_device_count,
    }


def host_warnings(figures: RuntimeFigures) -> list[str]:
    """What could differ between the hosts of a slice, as far as this host can see (``doctor``).

    Nothing on one host. On several: ``PJRT_DEVICE`` unset (each host then picks its own device,
    :func:`~xla_plugins.runtime._probes.require_torch_xla`); the versions of :data:`SLICE_DISTRIBUTIONS`,
    which must match on every host and can only be compared across the hosts' outputs; devices
    that do not add up (``global != hosts x local``: hosts with different device counts).
    """
    if figures.process_count <= 1:
        return []
    warnings_ = []
    if not os.environ.get("PJRT_DEVICE", "").strip():
        warnings_.append(
            "PJRT_DEVICE is not set: each host picks its own device type (TPU only where libtpu finds a chip);"
            " set PJRT_DEVICE=TPU on every host"
        )
    versions = ", ".join(f"{name} {_version_or(name)}" for name in SLICE_DISTRIBUTIONS)
    warnings_.append(
        f"{figures.process_count} hosts: every host must run the same versions ({versions}) and environment;"
        " compare this output across hosts (run it with --worker=all)"
    )
    if figures.global_device_count != figures.process_count * figures.addressable_device_count:
        warnings_.append(
            f"{figures.global_device_count} global devices are not {figures.process_count} hosts x"
            f" {figures.addressable_device_count} local devices: the hosts have different device counts"
        )
    return warnings_


def _pjrt_device_shown() -> str:
    """``PJRT_DEVICE`` as ``doctor`` shows it: the value, or what its absence or emptiness means."""
    raw = os.environ.get("PJRT_DEVICE")
    if raw is None:
        return "(unset: torch_xla picks a TPU if attached, else CPU)"
    return raw if raw.strip() else "'' (set but empty)"


def _version_or(distribution: str) -> str:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "not installed"
