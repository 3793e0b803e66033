"""``torch.tpu`` under the stand-in: the device module torch reads for a PrivateUse1 backend.

As on TorchTPU with torch >= 2.11, the legacy functions (:data:`LEGACY`) raise ``RuntimeError`` when
called from code outside torch and torchtpu_plugins: counts, availability and synchronisation go
through ``torch.accelerator``. Random numbers of the stand-in come from torch's CPU generator (there is
no ``"tpu"`` generator), so this module's RNG functions act on it: ``torch.manual_seed`` seeds it, and
``torch.random.fork_rng(device_type="tpu")`` saves and restores it.
"""

from __future__ import annotations

import contextlib
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


class Event:
    """An event of the stand-in: every kernel has finished when it returns, so an event is always complete.

    Enough for torch's FSDP2 (``fully_shard``), which orders its copies and collectives with events.
    """

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing

    def record(self, stream: Any = None) -> None:
        return None

    def wait(self, stream: Any = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class Stream:
    """A stream of the stand-in: the stand-in runs every kernel at once, so streams order nothing.

    Enough for torch's FSDP2 (``fully_shard``), which overlaps its copies and collectives on side
    streams; on the stand-in they run in program order, which gives the same values.
    """

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device = device
        self.priority = priority

    def wait_stream(self, stream: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> Event:
        return event if event is not None else Event()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


_DEFAULT_STREAM = Stream()


@_legacy
def current_stream(device: Any = None) -> Stream:
    return _DEFAULT_STREAM


def default_stream(device: Any = None) -> Stream:
    return _DEFAULT_STREAM


@_legacy
def set_stream(stream: Any) -> None:
    """Nothing to switch: the stand-in's streams order nothing."""


def stream(stream: Any) -> contextlib.nullcontext:
    """Context manager running kernels on ``stream``: on the stand-in, where they run anyway."""
    return contextlib.nullcontext()
