"""Warnings torch and torch_xla raise from inside the strategies' own calls, silenced around those calls only.

Each is about code the user does not write and cannot change, and repeats at every step or save:

* :data:`BACKWARD_BARRIER`: torch_xla's FSDPv2 wrapper registers a full backward hook on every
  wrapped module (``xla_sharding.apply_backward_optimization_barrier``); with integer inputs (token
  ids) no input requires a gradient and torch warns at every backward pass. The hook still runs.
* :data:`NON_TENSOR_OUTPUT`: torch warns when a module with a full backward hook (FSDPv2's root
  wrapper, see :data:`BACKWARD_BARRIER`) returns neither a tensor nor a tuple: at every evaluation
  step whose ``validation_step``, ``test_step`` or ``predict_step`` returns nothing or a dict. No
  backward pass follows an evaluation step, so there is no hook call to miss.
* :data:`SHARDED_CHECKPOINT`: ``torch.distributed.checkpoint`` warns at every single-process
  save (one host has no process group), even when told so with ``no_dist=True``; it warns that torch_xla's
  ``SPMDSavePlanner`` has the old ``set_up_planner`` signature and uses the deprecated
  ``TypedStorage``; torch_xla's sharded tensor indexes with a list (deprecated by torch).

``warnings.catch_warnings`` restores the filters on exit, so nothing outlives the call. Its filters
are the whole process's, though: a block on one thread that opens and closes while a block on
another is open loses or leaks the other's filters. A call on a writer thread (a sharded checkpoint
written in the background) therefore uses :func:`silenced_on_this_thread`: one filter that stays
installed and ignores the messages only on a thread inside such a block.
"""

from __future__ import annotations

import re
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

BACKWARD_BARRIER = (
    "Full backward hook is firing when gradients are computed with respect to module outputs since no inputs"
    " require gradients",
)
NON_TENSOR_OUTPUT = (
    "For backward hooks to be called, module output should be a Tensor or a tuple of Tensors but received",
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


class _ThreadMessages(threading.local):
    """The message part of a ``warnings`` filter: matches only on a thread inside :func:`silenced_on_this_thread`.

    ``warnings`` (its C implementation too) matches a filter's message by calling its ``match(text)``,
    as it would a compiled regular expression's.
    """

    messages: tuple[str, ...] = ()

    def match(self, text: str) -> bool:
        return text.startswith(self.messages) if self.messages else False


_ON_THIS_THREAD = _ThreadMessages()
_FILTER = ("ignore", _ON_THIS_THREAD, Warning, None, 0)


@contextmanager
def silenced_on_this_thread(messages: tuple[str, ...]) -> Iterator[None]:
    """Ignore warnings starting with any of ``messages`` inside the block, on this thread only.

    Installs (once, and again if a ``catch_warnings`` block elsewhere dropped it) a filter that
    ignores nothing on any thread outside such a block.
    """
    if _FILTER not in warnings.filters:
        warnings.filters.insert(0, _FILTER)  # type: ignore[attr-defined]
        mutated = getattr(warnings, "_filters_mutated", None)  # what warnings.filterwarnings calls (Python 3.11)
        if callable(mutated):
            mutated()
    outer, _ON_THIS_THREAD.messages = _ON_THIS_THREAD.messages, messages
    try:
        yield
    finally:
        _ON_THIS_THREAD.messages = outer
