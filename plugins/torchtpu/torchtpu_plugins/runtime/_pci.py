"""The TPU chips on this host's PCI bus, read from files (``/sys/bus/pci``, ``/dev/vfio``): nothing starts.

TorchTPU counts a chip when its PCI vendor is Google's, its device id names a TPU generation, and its
IOMMU group exists under ``/dev/vfio``; it starts its device at ``import torch`` only where it counts
one. The same rule here, so that the probes and the launch environment see what TorchTPU would see.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

#: The PCI vendor id of Google's TPU chips.
TPU_PCI_VENDOR = "0x1ae0"
#: PCI device id -> TPU generation (torch-tpu 0.2.0's list).
GENERATIONS = {"0x005e": "v4", "0x0062": "v5p", "0x0063": "v5e", "0x006f": "v6e", "0x0076": "v7"}
#: Generation -> {chips on one host: TORCH_TPU_TOPOLOGY}, the single-host layouts torch-tpu 0.2.0 knows.
HOST_TOPOLOGIES: dict[str, dict[int, str]] = {
    "v4": {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,2,2"},
    "v5p": {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,2,2"},
    "v5e": {1: "1,1,1", 4: "2,2,1", 8: "2,4,1"},
    "v6e": {1: "1,1,1", 4: "2,2,1", 8: "2,4,1"},
    "v7": {2: "1,1,1,2", 4: "1,2,1,2", 8: "2,2,1,2"},
}
PCI_DEVICES = Path("/sys/bus/pci/devices")
VFIO = Path("/dev/vfio")


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def tpu_chips() -> list[str]:
    """The generation of each TPU chip on the PCI bus whose IOMMU group is open under ``/dev/vfio``."""
    chips = []
    try:
        devices = sorted(PCI_DEVICES.iterdir())
    except OSError:
        return []
    for device in devices:
        if _read(device / "vendor") != TPU_PCI_VENDOR:
            continue
        generation = GENERATIONS.get(_read(device / "device") or "")
        try:
            group = os.readlink(device / "iommu_group").rsplit("/", 1)[-1]
        except OSError:
            continue
        if generation is not None and (VFIO / group).exists():
            chips.append(generation)
    return chips


def host_topology(chips: list[str], count: Optional[int] = None) -> Optional[str]:
    """``TORCH_TPU_TOPOLOGY`` for ``count`` chips (default: all) of the generation of ``chips`` (``None``: no chips).

    Raises:
        ValueError: the generation has no single-host layout of ``count`` chips (the message lists them).
    """
    if not chips:
        return None
    layouts = HOST_TOPOLOGIES[chips[0]]
    wanted = len(chips) if count is None else count
    if wanted not in layouts:
        raise ValueError(
            f"TPU {chips[0]} has no single-host layout of {wanted} chips; valid counts: {', '.join(map(str, layouts))}"
        )
    return layouts[wanted]
