"""``torch.tpu`` under the stand-in: the device module torch reads for a PrivateUse1 backend.

As on TorchTPU with torch >= 2.11, the legacy functions (:data:`LEGACY`) raise ``RuntimeError`` when
called from code outside torch and torchtpu_plugins: counts, availability and synchronisation go
through ``torch.accelerator``. Random numbers of the stand-in come from torch's CPU generator (there is
no ``"tpu"`` generator), so this module's RNG functions act on it: ``torch.manual_seed`` seeds it, and
``torch.random.fork_rng(device_type="tpu")`` saves and restores it.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import torch

#: The environment variable giving the number of stand-in devices reported (default 1).
COUNT_VARIABLE = "TORCHTPU_PLUGINS_DEVICE_COUNT"
_F = TypeVar("_F", bound=Callable[..., Any])


def _count() -> int:
    value = os.environ.get(COUNT_VARIABLE, "1")
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"{COUNT_VARIABLE}={value!r} is not a valid device count; valid: an integer >= 1 (default 1)")
    return count


#: The device count reported, read once when the stand-in is installed.
DEVICE_COUNT = _count()


def _legacy(function: _F) -> _F:
    """Make ``function`` raise when called from outside torch and torchtpu_plugins, as TorchTPU does."""

    @functools.wraps(function)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.split(".")[0] not in ("torch", "torchtpu_plugins"):
            raise RuntimeError(
                f"torch.tpu.{function.__name__}() is a legacy device API that TorchTPU refuses on torch >= 2.11 "
                f"(called from {caller or '?'}); use torch.accelerator instead"
            )
        return function(*args, **kwargs)

    return guarded  # type: ignore[return-value]


@_legacy
def is_available() -> bool:
    return True


@_legacy
def device_count() -> int:
    return DEVICE_COUNT


@_legacy
def current_device() -> int:
    return 0


@_legacy
def set_device(device: Any) -> None:
    index = torch.device("tpu", device).index if isinstance(device, int) else torch.device(device).index
    if index not in (None, 0):
        raise RuntimeError(f"the TorchTPU stand-in binds each process to device tpu:0; cannot set {device!r}")


@_legacy
def synchronize(device: Any = None) -> None:
    """Nothing to wait for: every kernel of the stand-in has finished when it returns."""


@_legacy
def get_rng_state(device: Any = "tpu") -> torch.Tensor:
    return torch.get_rng_state()


@_legacy
def set_rng_state(new_state: torch.Tensor, device: Any = "tpu") -> None:
    torch.set_rng_state(new_state)


@_legacy
def initial_seed() -> int:
    return torch.initial_seed()


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def _lazy_init() -> None:
    """Nothing to initialise: the stand-in is ready once installed."""


def manual_seed(seed: int) -> None:
    """Seed the stand-in's random numbers: torch's CPU generator."""
    torch.default_generator.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    """Seed the stand-in's random numbers (one generator for every device): torch's CPU generator."""
    torch.default_generator.manual_seed(seed)


def get_amp_supported_dtype() -> list[torch.dtype]:
    """The dtypes ``torch.autocast("tpu", dtype=...)`` accepts: bfloat16 (TorchTPU's) and float16."""
    return [torch.bfloat16, torch.float16]


class device:  # noqa: N801 (torch's device modules name this context manager `device`)
    """Context manager selecting a device index; the stand-in has one per process, ``tpu:0``.

    Raises:
        RuntimeError: an index other than 0.
    """

    def __init__(self, device: Any) -> None:
        index = device if isinstance(device, int) or device is None else torch.device(device).index
        if index not in (None, 0, -1):
            raise RuntimeError(f"the TorchTPU stand-in binds each process to device tpu:0; cannot select {device!r}")

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        return None
