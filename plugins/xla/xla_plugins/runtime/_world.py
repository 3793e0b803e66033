"""The world model: Lightning's world size and ranks from torch_xla's process and device figures.

Written once, as pure functions of :class:`RuntimeFigures` (what
``torch_xla.runtime`` reports), for both ways the plugin runs on a TPU slice of several hosts
(the same script started on every host):

* **one replica per device** (``xla``): ``xmp.spawn`` starts ``local_process_count`` processes per
  host, each driving its addressable devices with one replica thread each. Every replica is a
  Lightning rank: ``world_size`` is the number of devices of the slice, ``global_rank`` the
  replica's global ordinal, ``local_rank`` its local ordinal, ``node_rank`` the host's index.
* **one process per host** (``xla_spmd`` and every strategy built on the same base): one process
  per host drives that host's devices, and the mesh spans the devices of every host. Every host is
  a Lightning rank: ``world_size`` is the number of processes, ``global_rank`` the process index,
  ``local_rank`` 0. This is torch_xla's own rule for SPMD (``torch_xla._internal.rendezvous``: "In
  SPMD, the world size and rank are determined by the process count and index").

Each host loads only its share of the data: :func:`host_sampler_kwargs` are the
``DistributedSampler`` arguments Lightning injects from ``distributed_sampler_kwargs``, and
:func:`host_step_indices` spells out which sample indices each host contributes to each global
batch (torch_xla's ``minibatch`` input sharding joins the hosts' shares into the global batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Optional


@dataclass(frozen=True)
class RuntimeFigures:
    """What ``torch_xla.runtime`` reports about this process's (and replica thread's) place in the job.

    The strategies and the XLA environment take world sizes and ranks from these figures only
    (this module turns them into Lightning's), read through :func:`~xla_plugins.runtime._probes.runtime_figures`,
    the one adapter between the plugin and torch_xla's process and device queries. Each field names
    the ``torch_xla.runtime`` function it comes from.

    Attributes:
        process_count: processes in the job across all hosts (``process_count()``).
        process_index: this process's index in ``[0, process_count)`` (``process_index()``).
        local_process_count: processes on this host (``local_process_count()``: one per TPU chip
            under ``xmp.spawn``, 1 for an SPMD run or on PJRT CPU).
        global_device_count: devices across all hosts (``global_runtime_device_count()``, which
            counts physical devices also in SPMD mode, where ``global_device_count()`` is 1).
        addressable_device_count: devices this process drives (``addressable_runtime_device_count()``).
        global_ordinal: this replica thread's ordinal across all hosts (``global_ordinal()``; 0 in
            SPMD mode, where one process drives the virtual device).
        local_ordinal: this replica thread's ordinal on its host (``local_ordinal()``).
    """

    process_count: int
    process_index: int
    local_process_count: int
    global_device_count: int
    addressable_device_count: int
    global_ordinal: int = 0
    local_ordinal: int = 0


class World(NamedTuple):
    """Lightning's view of one rank: the values its strategy and cluster environment report."""

    world_size: int
    global_rank: int
    local_rank: int
    node_rank: int
    num_nodes: int


def check_figures(figures: RuntimeFigures) -> RuntimeFigures:
    """Return ``figures`` if they describe one consistent job; else raise naming the figure at fault.

    The rules are torch_xla's own assumptions: each process drives the same number of devices
    (``torch_xla.runtime.local_device_count`` multiplies by it), so the global device count is the
    process count times the addressable device count; each host runs the same number of processes
    (``torch_xla._internal.tpu.configure_topology`` numbers process ``local_rank`` of host ``w`` as
    ``w * local_process_count + local_rank``); indices and ordinals lie in their ranges.

    Args:
        figures: what ``torch_xla.runtime`` reported (:func:`~xla_plugins.runtime._probes.runtime_figures`).

    Raises:
        ValueError: a count below 1, an index or ordinal out of range, a process count that is not a
            multiple of the processes per host, or a global device count that is not
            ``process_count x addressable_device_count``; the message names the figures.
    """
    f = figures
    counts = ("process_count", "local_process_count", "global_device_count", "addressable_device_count")
    for name in counts:
        if getattr(f, name) < 1:
            raise ValueError(f"torch_xla reported {name}={getattr(f, name)}; it must be at least 1 ({f}).")
    if f.process_count % f.local_process_count:
        raise ValueError(
            f"torch_xla reported process_count={f.process_count}, not a multiple of"
            f" local_process_count={f.local_process_count}: every host must run the same number of processes ({f})."
        )
    if f.global_device_count != f.process_count * f.addressable_device_count:
        raise ValueError(
            f"torch_xla reported global_device_count={f.global_device_count}, but process_count={f.process_count}"
            f" x addressable_device_count={f.addressable_device_count}"
            f" = {f.process_count * f.addressable_device_count}:"
            " every process must drive the same number of devices (are all hosts of the slice alike?)."
        )
    ranges = (
        ("process_index", f.process_index, f.process_count),
        ("global_ordinal", f.global_ordinal, f.global_device_count),
        ("local_ordinal", f.local_ordinal, f.local_process_count * f.addressable_device_count),
    )
    for name, value, bound in ranges:
        if not 0 <= value < bound:
            raise ValueError(f"torch_xla reported {name}={value}, outside [0, {bound}) ({f}).")
    return f


def one_replica_per_device(figures: RuntimeFigures) -> World:
    """The world of a replica of the one-worker-per-device strategy (``xla``).

    * ``world_size``: devices of the slice (``global_runtime_device_count``), as
      ``torch_xla.runtime.world_size()`` reports it inside ``xmp.spawn``;
    * ``global_rank``: the replica's ``global_ordinal`` (torch_xla: not guaranteed to follow the
      host order, so no rank arithmetic is done on it);
    * ``local_rank``: the replica's ``local_ordinal`` (its device on this host);
    * ``num_nodes``: hosts, ``process_count / local_process_count``;
    * ``node_rank``: this host, ``process_index // local_process_count`` (torch_xla numbers
      process ``local_rank`` of TPU worker ``w`` as ``w * local_process_count + local_rank``, so
      this is the TPU worker id).

    Args:
        figures: this replica thread's :class:`RuntimeFigures`.

    Raises:
        ValueError: inconsistent figures (see :func:`check_figures`).
    """
    f = check_figures(figures)
    return World(
        world_size=f.global_device_count,
        global_rank=f.global_ordinal,
        local_rank=f.local_ordinal,
        node_rank=f.process_index // f.local_process_count,
        num_nodes=f.process_count // f.local_process_count,
    )


def one_rank_per_process(figures: RuntimeFigures) -> World:
    """The worker processes of an ``xmp.spawn`` run as ranks: one rank per worker process, over all hosts.

    ``world_size`` is ``process_count``, ``global_rank`` the ``process_index``, ``local_rank`` the
    process's index on its host, ``node_rank`` and ``num_nodes`` as :func:`one_replica_per_device`.
    (torch_xla's own ``xla://`` rendezvous gives a spawned worker a rank per *device* instead.) The
    spawn strategy's stop agreement over several hosts runs in a gloo group of these ranks.

    Args:
        figures: the :class:`RuntimeFigures` of a replica of the worker process.

    Raises:
        ValueError: inconsistent figures (see :func:`check_figures`).
    """
    f = check_figures(figures)
    return World(
        world_size=f.process_count,
        global_rank=f.process_index,
        local_rank=f.process_index % f.local_process_count,
        node_rank=f.process_index // f.local_process_count,
        num_nodes=f.process_count // f.local_process_count,
    )


def leads_its_process(figures: RuntimeFigures) -> bool:
    """Whether the replica of ``figures`` is the first its worker process drives: its ``local_ordinal`` is a
    multiple of ``addressable_device_count`` (``torch_xla.runtime.local_ordinal`` is the process's local rank
    times its device count plus the device's index).

    Raises:
        ValueError: inconsistent figures (see :func:`check_figures`).
    """
    f = check_figures(figures)
    return f.local_ordinal % f.addressable_device_count == 0


def one_process_per_host(figures: RuntimeFigures) -> World:
    """The world of a process of the SPMD strategies (``xla_spmd``): one process per host.

    ``world_size`` = ``num_nodes`` = ``process_count``; ``global_rank`` = ``node_rank`` =
    ``process_index``; ``local_rank`` = 0. torch_xla's ``xla://`` rendezvous gives SPMD processes
    the same world size and rank.

    Args:
        figures: this process's :class:`RuntimeFigures`.

    Raises:
        ValueError: inconsistent figures (see :func:`check_figures`), or more than one process per
            host (SPMD drives all devices of a host from one process; an ``xmp.spawn`` launch or
            ``PJRT_LOCAL_PROCESS_COUNT`` above 1 cannot run it).
    """
    f = check_figures(figures)
    if f.local_process_count != 1:
        raise ValueError(
            f"The SPMD strategies run one process per host, but torch_xla reports local_process_count="
            f"{f.local_process_count}. Start the script once per host (not through xmp.spawn) and leave"
            " PJRT_LOCAL_PROCESS_COUNT unset."
        )
    return World(
        world_size=f.process_count,
        global_rank=f.process_index,
        local_rank=0,
        node_rank=f.process_index,
        num_nodes=f.process_count,
    )


def host_sampler_kwargs(world: World) -> Optional[dict[str, int]]:
    """``distributed_sampler_kwargs`` of a one-process-per-host strategy: ``None`` on one host.

    On several hosts, ``{"num_replicas": world_size, "rank": global_rank}``: Lightning injects a
    ``DistributedSampler`` over the hosts, as torch_xla's multi-host SPMD examples build one with
    ``num_replicas=xr.process_count(), rank=xr.process_index()``. On one host no sampler is
    injected and the loader's own order is dealt out to the devices.
    """
    if world.world_size == 1:
        return None
    return {"num_replicas": world.world_size, "rank": world.global_rank}


def host_step_indices(
    size: int,
    world: World,
    local_devices: int,
    per_device_batch: int,
    shuffle: bool = False,
    seed: int = 0,
    epoch: int = 0,
) -> list[list[int]]:
    """The sample indices one host loads for each step of an epoch (its share of each global batch).

    The host's loader draws from ``DistributedSampler(dataset, **host_sampler_kwargs(world),
    shuffle=shuffle, seed=seed)`` (no sampler on one host: the data set in order when not
    shuffled), batches by ``per_device_batch``, and joins ``local_devices`` consecutive batches into
    the host's share of one global batch (:class:`~xla_plugins.strategies._batches.GlobalBatches`).
    The shares of all hosts at one step form the global batch of that step. As with DDP,
    ``DistributedSampler`` pads the data set to a multiple of the hosts by repeating its first
    indices, so every host runs the same number of steps (SPMD needs every host in every step).

    Args:
        size: samples in the data set.
        world: the host's :class:`World` (:func:`one_process_per_host`).
        local_devices: devices of this host (``addressable_runtime_device_count``).
        per_device_batch: the loader's ``batch_size``.
        shuffle: whether the loader shuffles (Lightning's injected sampler keeps the loader's choice).
        seed: the sampler's seed, as ``DistributedSampler``'s.
        epoch: the epoch (``DistributedSampler.set_epoch``), which changes a shuffled order.

    Raises:
        ValueError: ``local_devices`` or ``per_device_batch`` below 1.
    """
    import torch
    from torch.utils.data import DistributedSampler, RandomSampler, SequentialSampler

    if local_devices < 1 or per_device_batch < 1:
        raise ValueError(
            f"local_devices and per_device_batch must be at least 1, got {local_devices} and {per_device_batch}."
        )
    data = range(size)
    kwargs = host_sampler_kwargs(world)
    sampler: Any
    if kwargs is not None:
        sampler = DistributedSampler(data, shuffle=shuffle, seed=seed, **kwargs)  # type: ignore[arg-type]
        sampler.set_epoch(epoch)
    elif shuffle:
        sampler = RandomSampler(data, generator=torch.Generator().manual_seed(seed + epoch))  # type: ignore[arg-type]
    else:
        sampler = SequentialSampler(data)  # type: ignore[arg-type]
    order = list(sampler)
    share = per_device_batch * local_devices
    return [order[start : start + share] for start in range(0, len(order), share)]
