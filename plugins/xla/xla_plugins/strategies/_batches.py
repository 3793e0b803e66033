"""What a loader's batch means when one process drives a mesh of devices (the SPMD strategies).

Every Lightning multi-device strategy (DDP, Lightning's ``XLAStrategy``, this plugin's ``xla``)
reads a loader's ``batch_size`` as the batch of *one device*: N devices train on a global batch of
``batch_size x N`` per optimizer step. torch_xla's SPMD examples read it as the *global* batch,
split N ways. A strategy that drives a whole mesh from one process (``xla_spmd``, and later
sharded strategies) chooses one of the two meanings here:

* :data:`PER_DEVICE` (the default): the loader yields per-device batches; :class:`GlobalBatches`
  joins N consecutive ones into the global batch of one step, so device ``i`` of the mesh trains
  on the ``i``-th of them. An epoch has ``ceil(len(loader) / N)`` steps, as many as a
  one-worker-per-device strategy gives on the same loader with ``drop_last=False``
  (``ceil(ceil(size / N) / batch_size) == ceil(ceil(size / batch_size) / N)``). No sampler is
  injected: the loader's own sampler or batch sampler decides the order (``shuffle=False`` keeps
  it) and custom (batch) samplers work unchanged.
* :data:`GLOBAL`: each loader batch is the global batch (torch_xla's meaning); an epoch has
  ``len(loader)`` steps.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Optional

import torch
from torch import Tensor

#: The loader's ``batch_size`` is one device's batch; global batch = batch_size x devices.
PER_DEVICE = "per_device"
#: The loader's ``batch_size`` is the global batch, split across the devices (torch_xla's SPMD meaning).
GLOBAL = "global"
BATCH_MEANINGS = (PER_DEVICE, GLOBAL)


def check_batch_meaning(batch: Any) -> str:
    """Return ``batch`` if it is one of :data:`BATCH_MEANINGS`.

    Raises:
        ValueError: anything else, naming the value and the valid choices.
    """
    if isinstance(batch, str) and batch in BATCH_MEANINGS:
        return batch
    raise ValueError(f"`batch={batch!r}` is not a batch meaning. Choose one of {', '.join(map(repr, BATCH_MEANINGS))}.")


def loader_batches_per_step(batch: str, devices: int) -> int:
    """How many loader batches make one global batch: ``devices`` for :data:`PER_DEVICE`, else 1."""
    return devices if check_batch_meaning(batch) == PER_DEVICE else 1


def describe(loader: Any, batch: str, devices: int) -> str:
    """One line for the start-up log: the per-device and the global batch of ``loader``'s steps.

    The size is the loader's ``batch_size``, else its batch sampler's (Lightning rebuilds a
    prediction loader around its batch sampler, leaving ``batch_size`` unset).
    """
    size = getattr(loader, "batch_size", None) or getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    if check_batch_meaning(batch) == GLOBAL:
        per_device = f"{size / devices:g}" if size else f"1/{devices} of a loader batch"
        return (
            f"batch={GLOBAL!r}: the loader's batch is the global batch ({size or 'batch sampler'}),"
            f" split over {devices} devices (per-device batch {per_device})"
        )
    if size:
        return (
            f"per-device batch {size}, global batch {size * devices} ({size} x {devices} devices);"
            f" batch={GLOBAL!r} makes the loader's batch_size the global batch"
        )
    return (
        f"per-device batch: one batch of the loader's batch sampler, global batch: {devices} of them"
        f" ({devices} devices); batch={GLOBAL!r} makes each loader batch the global batch"
    )


def concatenate(batches: Sequence[Any]) -> Any:
    """Join per-device batches (one collate output each) into one batch along the first dimension.

    Tensors of one or more dimensions are concatenated; mappings, tuples (named tuples too), lists
    of tensors or collections and dataclass instances are joined field by field, the structures
    Lightning's ``apply_to_collection`` walks (a dataclass's fields, ``init=False`` ones included,
    are set on a shallow copy of the first batch's instance, as Lightning sets them on a copy);
    lists of other values (strings, numbers: a collated batch of them) are chained. Numbers,
    strings, ``None`` and 0-d tensors (a batch-wide value, not one row per sample) are taken from
    the first batch when every batch holds the same value.

    Args:
        batches: one batch per device, each of the same structure (non-empty).

    Raises:
        TypeError: a value of a type that cannot be joined (a user batch class that is not a
            dataclass, for example one with its own ``.to()``), batch-wide values that differ
            between the batches, or tensors that differ beyond the first dimension; the message
            names the type, the values or the shapes and the ways out (``batch="global"``, or one
            of the structures above). Taking the first batch's value instead would train each step
            on one device's share of the data.
    """
    first = batches[0]
    if len(batches) == 1:
        return first
    if isinstance(first, Tensor):
        return _joined_tensor(batches) if first.dim() > 0 else _same_value(batches)
    if isinstance(first, Mapping):
        return type(first)({key: concatenate([batch[key] for batch in batches]) for key in first})  # type: ignore[call-arg]
    if isinstance(first, tuple):
        fields = [concatenate(column) for column in zip(*batches, strict=True)]
        return type(first)(*fields) if hasattr(first, "_fields") else type(first)(fields)
    if isinstance(first, list):
        if first and all(isinstance(item, (Tensor, Mapping, list, tuple)) or _is_dataclass(item) for item in first):
            return [concatenate(column) for column in zip(*batches, strict=True)]
        return [item for batch in batches for item in batch]
    if _is_dataclass(first):
        joined = copy.copy(first)
        for field in dataclasses.fields(first):
            # object.__setattr__ also sets the fields of a frozen dataclass (on the copy only)
            object.__setattr__(joined, field.name, concatenate([getattr(batch, field.name) for batch in batches]))
        return joined
    if first is None or isinstance(first, (bool, int, float, complex, str, bytes)):
        return _same_value(batches)
    raise TypeError(
        f"A batch of type {type(first).__qualname__} cannot be joined into a global batch: the SPMD strategies"
        f" join {len(batches)} per-device batches per step field by field, and they can do so for tensors,"
        " mappings, tuples, lists and dataclasses only. Return one of those from the collate function (a"
        " dataclass keeps attribute access), or pass `batch='global'` to the strategy"
        " (`XLASPMDStrategy(batch='global')`) so that each loader batch is the global batch as it is."
    )


def _joined_tensor(batches: Sequence[Any]) -> Tensor:
    """The per-device tensors of one field joined along the first dimension (``torch.cat``).

    Raises:
        TypeError: a batch holds no tensor there, or the tensors differ beyond the first dimension
            (each device's collate function padded to its own longest sequence, say); the message
            names the shapes and the ways out.
    """
    first = batches[0]
    if all(isinstance(b, Tensor) and b.dim() == first.dim() and b.shape[1:] == first.shape[1:] for b in batches):
        return torch.cat(list(batches))
    shapes = ", ".join("x".join(map(str, b.shape)) if isinstance(b, Tensor) else type(b).__qualname__ for b in batches)
    raise TypeError(
        f"The {len(batches)} per-device batches of one step have tensors of different shapes ({shapes}), which"
        " cannot be joined into a global batch: the SPMD strategies join one loader batch per device along the"
        " first dimension. Pad every batch to one fixed length (a collate_fn with a fixed max_length), or pass"
        " `batch='global'` to the strategy (`XLASPMDStrategy(batch='global')`) so that each loader batch, padded"
        " as a whole, is the global batch."
    )


def _is_dataclass(value: Any) -> bool:
    """Whether ``value`` is a dataclass instance (not a dataclass type)."""
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _same_value(batches: Sequence[Any]) -> Any:
    """The batch-wide value (a number, string, ``None`` or 0-d tensor) the batches share.

    Raises:
        TypeError: the batches hold different values (see :func:`concatenate`).
    """
    first = batches[0]
    if isinstance(first, Tensor):
        if first.device.type != "cpu":  # comparing would read the device: a loader's batches are on the host
            return first
        same = all(isinstance(b, Tensor) and b.shape == first.shape and torch.equal(b, first) for b in batches)
    else:
        same = all(type(b) is type(first) and b == first for b in batches)
    if same:
        return first
    values = ", ".join(repr(b.item() if isinstance(b, Tensor) else b) for b in batches)
    raise TypeError(
        f"The per-device batches hold different values of one batch-wide field ({values}); a global batch"
        " can hold only one. Give that field one row per sample (a tensor with a first dimension), or pass"
        " `batch='global'` to the strategy so that each loader batch is the global batch as it is."
    )


class GlobalBatches:
    """A dataloader yielding global batches: ``per_step`` consecutive batches of ``loader`` joined.

    The last global batch may join fewer batches (the epoch's remainder), unless the loader drops
    its last incomplete batch (``drop_last=True`` on the ``DataLoader`` or its batch sampler): then
    an incomplete global batch is dropped too, so that every step trains on a full global batch, as
    on Lightning's multi-device strategies, where each device's loader drops its own incomplete
    batch. ``transform`` is applied to each global batch (a strategy's sharding). Attributes it
    does not define (``dataset``, ``sampler``, ``batch_sampler``, ``batch_size``, ...) are those of
    ``loader``, so Lightning's epoch setting and users' reads keep working.

    Args:
        loader: any iterable of batches (a ``DataLoader``).
        per_step: loader batches per global batch (see :func:`loader_batches_per_step`), ``>= 1``.
        transform: applied to every global batch, or ``None``.
    """

    def __init__(self, loader: Any, per_step: int, transform: Optional[Callable[[Any], Any]] = None) -> None:
        if per_step < 1:
            raise ValueError(f"per_step must be at least 1, got {per_step}")
        self.__dict__.update(_loader=loader, _per_step=per_step, _transform=transform)

    @property
    def loader(self) -> Any:
        """The wrapped loader."""
        return self._loader

    @property
    def batch_sampler(self) -> Any:
        """The loader's batch sampler; in prediction, a view whose seen indices are joined per step.

        Lightning's prediction loop reads the indices of step ``i`` (for prediction writers) as
        ``batch_sampler.seen_batch_indices[i]``; the view joins them as the batches are joined.
        """
        inner = getattr(self._loader, "batch_sampler", None)
        index_wrapper = _index_wrapper_class()
        if self._per_step == 1 or index_wrapper is None or not isinstance(inner, index_wrapper):
            return inner
        return _joined_index_view(index_wrapper)(inner, self._per_step, self.drops_last)

    def __getattr__(self, name: str) -> Any:
        loader = self.__dict__.get("_loader")
        if loader is None or name.startswith("__"):  # unset while copied or unpickled; no dunder lookups
            raise AttributeError(name)
        return getattr(loader, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._loader, name, value)  # e.g. Lightning's worker_init_fn goes to the real loader

    def __iter__(self) -> Iterator[Any]:
        """The global batches of one pass over the loader, whose ``iter()`` is called now, not at the first batch.

        Lightning calls ``iter()`` on every loader of a ``CombinedLoader`` before it fetches from any;
        a ``DataLoader`` draws its workers' base seed from torch's generator at ``iter()`` and its
        ``RandomSampler`` the epoch's seed at the first batch, so deferring ``iter()`` to the first
        batch would shuffle the second loader from another generator state than plain Lightning does.
        """
        return self._joined(iter(self._loader))

    def _joined(self, batches: Iterator[Any]) -> Iterator[Any]:
        group: list[Any] = []
        for batch in batches:
            group.append(batch)
            if len(group) == self._per_step:
                yield self._emit(group)
                group = []
        if group and not self.drops_last:
            yield self._emit(group)

    @property
    def drops_last(self) -> bool:
        """Whether the loader drops its last incomplete batch (``drop_last`` of it or of its batch sampler)."""
        loader = self._loader
        return bool(
            getattr(loader, "drop_last", False) or getattr(getattr(loader, "batch_sampler", None), "drop_last", False)
        )

    def _emit(self, group: list[Any]) -> Any:
        joined = concatenate(group)
        return joined if self._transform is None else self._transform(joined)

    def __len__(self) -> int:
        if self.drops_last:
            return len(self._loader) // self._per_step
        return math.ceil(len(self._loader) / self._per_step)


def _index_wrapper_class() -> Optional[type]:
    """Lightning's (private) ``_IndexBatchSamplerWrapper``, which records a prediction's batch indices."""
    try:
        from lightning.pytorch.overrides.distributed import _IndexBatchSamplerWrapper
    except ImportError:  # pragma: no cover - every supported Lightning has it (2.5, 2.6)
        return None
    return _IndexBatchSamplerWrapper


@functools.cache
def _joined_index_view(base: type) -> type:
    """A read-only ``base`` (``_IndexBatchSamplerWrapper``) whose ``seen_batch_indices`` are joined per step."""

    class JoinedIndexBatches(base):  # type: ignore[misc, valid-type]
        def __init__(self, inner: Any, per_step: int, drops_last: bool) -> None:  # base's __init__ is not called
            self.__dict__.update(_inner=inner, _per_step=per_step, _drops_last=drops_last)

        @property  # type: ignore[misc]
        def seen_batch_indices(self) -> list[list[int]]:
            seen, step = self._inner.seen_batch_indices, self._per_step
            if self._drops_last:  # the batches of a dropped incomplete step were seen, never predicted
                seen = seen[: len(seen) - len(seen) % step]
            return [[i for batch in seen[start : start + step] for i in batch] for start in range(0, len(seen), step)]

        def __len__(self) -> int:
            if self._drops_last:
                return len(self._inner) // self._per_step
            return math.ceil(len(self._inner) / self._per_step)

        def __getattr__(self, name: str) -> Any:
            inner = self.__dict__.get("_inner")
            if inner is None or name.startswith("__"):
                raise AttributeError(name)
            return getattr(inner, name)

    return JoinedIndexBatches
