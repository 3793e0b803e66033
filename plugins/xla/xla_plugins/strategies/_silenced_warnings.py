"""Warnings torch and torch_xla raise from inside the strategies' own calls, silenced around those calls only.

Each is about code the user does not write and cannot change, and repeats at every step or save:

* :data:`BACKWARD_BARRIER`: torch_xla's FSDPv2 wrapper registers a full backward hook on every
  wrapped module (``xla_sharding.apply_backward_optimization_barrier``); with integer inputs (token
  ids) no input requires a gradient and torch warns at every backward pass. The hook still runs.
* :data:`SHARDED_CHECKPOINT`: ``torch.distributed.checkpoint`` warns at every single-process
  save (one host has no process group), even when told so with ``no_dist=True``; it warns that torch_xla's
  ``SPMDSavePlanner`` has the old ``set_up_planner`` signature and uses the deprecated
  ``TypedStorage``; torch_xla's sharded tensor indexes with a list (deprecated by torch).

``warnings.catch_warnings`` restores the filters on exit, so nothing outlives the call.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

BACKWARD_BARRIER = (
    "Full backward hook is firing when gradients are computed with respect to module outputs since no inputs"
    " require gradients",
)
SHARDED_CHECKPOINT = (
    "torch.distributed is disabled, unavailable or uninitialized",  # warned even for an explicit no_dist=True
    "The function definition for SavePlanner.set_up_planner has been updated to include the storage_meta argument",
    "Using a non-tuple sequence for multidimensional indexing is deprecated",
    "TypedStorage is deprecated",
)


@contextmanager
def silenced(messages: tuple[str, ...]) -> Iterator[None]:
    """Ignore warnings starting with any of ``messages`` inside the block (every thread: the filters are global)."""
    with warnings.catch_warnings():
        for message in messages:
            warnings.filterwarnings("ignore", message=re.escape(message))
        yield
