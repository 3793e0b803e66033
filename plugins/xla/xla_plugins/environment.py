"""The XLA cluster environment: world size and ranks as the torch_xla runtime reports them."""

from __future__ import annotations

import logging
from typing import Any

from lightning.fabric.plugins.environments.xla import XLAEnvironment as _LightningXLAEnvironment
from typing_extensions import override

from xla_plugins import _runtime

log = logging.getLogger(__name__)


class XLAEnvironment(_LightningXLAEnvironment):
    """Cluster environment of XLA runs, read from ``torch_xla.runtime`` (torch_xla >= 2.1 names).

    Values are read on every call rather than cached: under PJRT, devices of one process run as
    threads, each with its own ordinal. Lightning cannot set the world size or ranks here; such
    calls are ignored with a debug message, as in Lightning.

    Raises:
        ModuleNotFoundError: torch_xla is not installed.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _runtime.require_torch_xla()
        super().__init__(*args, **kwargs)

    @staticmethod
    @override
    def detect() -> bool:
        """Whether torch_xla is installed and its PJRT device is usable."""
        from xla_plugins.accelerator import XLAAccelerator

        return XLAAccelerator.is_available()

    @override
    def world_size(self) -> int:  # type: ignore[override]  # Lightning's is cached
        """Number of replicas across all hosts: ``torch_xla.runtime.world_size()``."""
        import torch_xla.runtime as xr

        return xr.world_size()

    @override
    def global_rank(self) -> int:  # type: ignore[override]  # Lightning's is cached
        """Replica index across all hosts: ``torch_xla.runtime.global_ordinal()``."""
        import torch_xla.runtime as xr

        return xr.global_ordinal()

    @override
    def local_rank(self) -> int:  # type: ignore[override]  # Lightning's is cached
        """Replica index on this host: ``torch_xla.runtime.local_ordinal()``."""
        import torch_xla.runtime as xr

        return xr.local_ordinal()

    @override
    def node_rank(self) -> int:  # type: ignore[override]  # Lightning's is cached
        """Index of this host: ``torch_xla.runtime.host_index()``."""
        import torch_xla.runtime as xr

        return xr.host_index()
