"""What ``trainer-plugins doctor`` shows for TorchTPU: versions, the torch pair, chips, the variables that matter."""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, requires, version

from packaging.requirements import Requirement

from torchtpu_plugins import _autoload
from torchtpu_plugins.roles import _launch_environment
from torchtpu_plugins.runtime import _pci, _probes

#: Read by torch or torch-tpu once, when ``import torch`` loads the backends: set them before it, or not at all.
BEFORE_IMPORT_TORCH = ("TORCH_DEVICE_BACKEND_AUTOLOAD", _autoload.VARIABLE)


def _version_or(distribution: str) -> str:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "not installed"


def torch_pair() -> str:
    """The installed torch against the range the installed torch-tpu requires (its metadata), in words."""
    torch_version = _version_or("torch")
    try:
        wanted = next(Requirement(line) for line in requires("torch-tpu") or [] if Requirement(line).name == "torch")
    except (PackageNotFoundError, StopIteration):
        return f"torch {torch_version} (torch-tpu not installed; torch-tpu 0.2.0 needs torch>=2.11,<=2.15)"
    fits = wanted.specifier.contains(torch_version.split("+")[0], prereleases=True)
    return f"torch {torch_version} {'within' if fits else 'OUTSIDE'} torch-tpu's torch{wanted.specifier}"


def describe() -> dict[str, object]:
    """Versions of torch-tpu, libtpu and torch, the torch pair, the chips on the PCI bus, the variables read at
    ``import torch`` and by the workers' launch, whether the stand-in is on, and the ``"tpu"`` devices torch reports.

    Reads files, package metadata and ``torch.accelerator`` only (never the legacy ``torch.tpu.*``, never a
    tensor). Without a registered ``"tpu"`` device nothing starts and nothing goes to the network
    (tests/test_torchtpu_probes.py); with one, ``torch.accelerator.device_count()`` may start TorchTPU's
    runtime (not verified on TPU).
    """
    torch_tpu = _version_or("torch-tpu")
    if torch_tpu != "not installed" and not _probes.torch_tpu_installed():
        torch_tpu += " (not Google's: no torch.backends entry point torch_tpu._loader:load)"
    chips = _pci.tpu_chips()
    info: dict[str, object] = {
        "torch-tpu": torch_tpu,
        "libtpu": _version_or("libtpu"),
        "torch": _version_or("torch"),
        "torch pair": torch_pair(),
        "TPU chips seen": f"{len(chips)} x {chips[0]}"
        if chips
        else f"0 (no PCI device of vendor {_pci.TPU_PCI_VENDOR} with its /dev/vfio group)",
        # read once by torch at `import torch`: set it before, or not at all
        "TORCH_DEVICE_BACKEND_AUTOLOAD": os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "unset (backends load)"),
        "set before `import torch`": f"{', '.join(BEFORE_IMPORT_TORCH)} (read once, when torch loads its backends)",
        "set before the workers start": ", ".join(
            f"{name}={os.environ[name]!r}" if name in os.environ else f"{name} unset (derived when a run starts)"
            for name in _launch_environment.WORKER_VARIABLES
        ),
        "stand-in device": f"{_autoload.VARIABLE}={os.environ[_autoload.VARIABLE]}"
        if os.environ.get(_autoload.VARIABLE)
        else f"off ({_autoload.VARIABLE} unset)",
    }
    reason = _probes.unavailable_reason()
    info["'tpu' devices"] = _probes.device_count() if reason is None else f"none ({reason})"
    info["available"] = "yes" if reason is None else "no"
    return info
