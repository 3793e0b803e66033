"""Test double for a TPU pod slice: what ``torch_xla.runtime`` would report on each host of one.

No pod is needed to test the plugin's world model, its per-host data shares, the strategies' rank
properties and what ``trainer-plugins doctor`` prints on a slice. The plugin reads the runtime's
process and device figures through one adapter, ``xla_plugins.runtime._probes.runtime_figures()``;
``xla_plugins.testing.simulated_runtime(source)`` makes it answer ``source()`` instead. This
module builds those answers for a slice of ``hosts x devices_per_host`` chips, numbered as
torch_xla numbers a TPU slice:

* one process per host (an SPMD run, or ``doctor``'s probe): process index = host index;
* one process per chip (``xmp.spawn`` on TPU): the process of chip ``d`` on host ``w`` has index
  ``w * devices_per_host + d`` (``torch_xla._internal.tpu.configure_topology``), one device each;
* one process per host driving all its devices with one thread each (``xmp.spawn`` on PJRT CPU).

Only the figures are simulated: devices, graphs and collectives in a test stay torch_xla's own.
Global ordinals are permuted on purpose (``shuffled_ordinals``): torch_xla does not promise they
follow the hosts, so nothing may depend on that.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from xla_plugins.runtime._world import RuntimeFigures
from xla_plugins.testing import simulated_runtime

#: How ``xmp.spawn`` lays processes out: one per chip (TPU) or one per host with a thread per device (CPU).
PER_CHIP, PER_HOST_THREADS = "process per chip", "process per host, thread per device"


@dataclass(frozen=True)
class Slice:
    """A slice of ``hosts`` hosts with ``devices_per_host`` chips each."""

    name: str
    hosts: int
    devices_per_host: int

    @property
    def devices(self) -> int:
        return self.hosts * self.devices_per_host

    def host(self, index: int) -> RuntimeFigures:
        """The figures of host ``index``'s one process (SPMD strategies, ``doctor``'s probe)."""
        return RuntimeFigures(
            process_count=self.hosts,
            process_index=index,
            local_process_count=1,
            global_device_count=self.devices,
            addressable_device_count=self.devices_per_host,
        )

    def replica(self, host: int, device: int, layout: str = PER_CHIP) -> RuntimeFigures:
        """The figures of the replica thread of chip ``device`` on host ``host`` under ``xmp.spawn``."""
        ordinal = self.shuffled_ordinal(host * self.devices_per_host + device)
        if layout == PER_CHIP:
            return RuntimeFigures(
                process_count=self.devices,
                process_index=host * self.devices_per_host + device,
                local_process_count=self.devices_per_host,
                global_device_count=self.devices,
                addressable_device_count=1,
                global_ordinal=ordinal,
                local_ordinal=device,
            )
        return RuntimeFigures(
            process_count=self.hosts,
            process_index=host,
            local_process_count=1,
            global_device_count=self.devices,
            addressable_device_count=self.devices_per_host,
            global_ordinal=ordinal,
            local_ordinal=device,
        )

    def shuffled_ordinal(self, position: int) -> int:
        """A fixed permutation of ``range(devices)``: global ordinals need not follow the hosts."""
        step = next(s for s in range(self.devices // 2 + 1, 2 * self.devices + 2) if _coprime(s, self.devices))
        return (position * step + 1) % self.devices


def _coprime(a: int, b: int) -> bool:
    while b:
        a, b = b, a % b
    return a == 1


#: The slices every world-model test runs over (issue 14): one v4 host, 4 and 16 v4 hosts, 8 v5e hosts of 8.
SLICES = (
    Slice("1 host x 4 chips", 1, 4),
    Slice("4 hosts x 4 chips", 4, 4),
    Slice("16 hosts x 4 chips", 16, 4),
    Slice("v5e: 8 hosts x 8 chips", 8, 8),
)


@contextlib.contextmanager
def on_host(figures: RuntimeFigures) -> Iterator[RuntimeFigures]:
    """Run the block as if this process were the one whose ``torch_xla.runtime`` reports ``figures``."""
    with simulated_runtime(lambda: figures):
        yield figures
