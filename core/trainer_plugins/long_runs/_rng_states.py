"""The host's random number generators, captured and restored: torch's CPU generator, NumPy's and Python's.

A resumed run must draw the same host random numbers as the run it continues: a ``RandomSampler``
draws its epoch's seed from torch's generator when its iterator starts, ``DataLoader`` draws its
workers' base seed from it at ``iter()``, and a dataset's augmentation may draw from any of the three.
:func:`host_states` captures all three in plain values (a ``ByteTensor``, lists and numbers: a
checkpoint holding them still loads with ``torch.load(..., weights_only=True)``) and
:func:`restore_host_states` sets them back, as Lightning's ``isolate_rng`` does around the sanity
check (``lightning.pytorch.utilities.seed``), but across processes. A device's generator is
the backend's: a backend whose generator advances at points a resumed run does not repeat (a graph
execution, say) seeds it per training batch instead, from the run's seed kept with the loader's
position (:mod:`trainer_plugins.long_runs._loader_position`).
"""

from __future__ import annotations

import random
from typing import Any, Optional

import torch


def _numpy() -> Optional[Any]:
    try:
        import numpy
    except ImportError:  # pragma: no cover - torch's wheels bring NumPy; without it there is no state to keep
        return None
    return numpy


def host_states() -> dict[str, Any]:
    """The host generators' states now: ``{"torch": ByteTensor, "numpy": dict or None, "python": tuple}``.

    ``numpy`` holds ``numpy.random.get_state()`` (the legacy global generator, which
    ``numpy.random.rand`` and friends use) with its key array as a list of ints; ``python`` is
    ``random.getstate()``. Restore them with :func:`restore_host_states`.
    """
    numpy = _numpy()
    numpy_state = None
    if numpy is not None:
        kind, keys, position, has_gauss, cached_gaussian = numpy.random.get_state()
        numpy_state = {
            "kind": str(kind),
            "keys": keys.tolist(),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        }
    return {"torch": torch.get_rng_state(), "numpy": numpy_state, "python": random.getstate()}


def restore_host_states(states: dict[str, Any]) -> None:
    """Set the host generators to ``states`` (from :func:`host_states`, possibly in another process).

    A generator missing from ``states`` (``None``) is left as it is.
    """
    if states.get("torch") is not None:
        torch.set_rng_state(states["torch"])
    numpy = _numpy()
    saved = states.get("numpy")
    if numpy is not None and saved is not None:
        keys = numpy.asarray(saved["keys"], dtype=numpy.uint32)
        numpy.random.set_state((saved["kind"], keys, saved["position"], saved["has_gauss"], saved["cached_gaussian"]))
    if states.get("python") is not None:
        version, internal, gauss_next = states["python"]
        random.setstate((version, tuple(internal), gauss_next))
