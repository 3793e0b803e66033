"""The XLA cluster environment: world size and ranks as the torch_xla runtime reports them."""

from __future__ import annotations

import logging
from typing import Any

from lightning.fabric.plugins.environments.xla import XLAEnvironment as _LightningXLAEnvironment
from typing_extensions import override

from xla_plugins import _runtime
from xla_plugins._world import World, one_replica_per_device

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

    def world(self) -> World:
        """This replica's :class:`~xla_plugins._world.World` (one replica per device).

        From :func:`~xla_plugins._world.one_replica_per_device` over the runtime's
        figures (:func:`~xla_plugins._runtime.runtime_figures`).
        """
        return one_replica_per_device(_runtime.runtime_figures())

    @override
    def world_size(self) -> int:  # type: ignore[override]  # Lightning's is cached
        """Replicas across all hosts: the slice's devices (``torch_xla.runtime.global_runtime_device_count()``)."""
        return self.world().world_size

    @override
    def global_rank(self) -> int:  # type: ignore[override]  # Lightning's is cached
        """Replica index across all hosts: ``torch_xla.runtime.global_ordinal()``."""
        return self.world().global_rank

    @override
    def local_rank(self) -> int:  # type: ignore[override]  # Lightning's is cached
        """Replica index on this host: ``torch_xla.runtime.local_ordinal()``."""
        return self.world().local_rank

    @override
    def node_rank(self) -> int:  # type: ignore[override]  # Lightning's is cached
        """Index of this host: ``process_index() // local_process_count()`` (the TPU worker id)."""
        return self.world().node_rank
