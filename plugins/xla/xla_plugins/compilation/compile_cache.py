"""torch_xla's persistent compilation cache, as a setting: ``XLA_PLUGINS_COMPILE_CACHE=<folder>``.

torch_xla compiles every graph the first time a process sees it; a run of a real model spends tens
of seconds there before its first step, and again in every new process (each restart of a
preempted run). Its persistent cache (``torch_xla.runtime.initialize_cache(path)``, which must be
called before the first compilation) writes each compiled executable to a folder and reads it back
in a later process instead of compiling.

:func:`enable` (called by the XLA accelerator when it starts the runtime, before any graph runs)
turns the cache on for the folder named by :data:`CACHE_VARIABLE`, where reading it back can work:

* on PJRT CPU it is **not** turned on: with torch_xla 2.8 and 2.9 the CPU client writes the
  executables but cannot read them back (measured: every graph compiled again, with torch_xla's
  warning ``Deserializing serialized executable not supported`` once per graph; its counter
  ``PersistentCacheDeserializeFailure`` counts them). One warning says so instead;
* on other PJRT devices (TPU) it is turned on, writable by every process. Whether executables are
  read back there is not verified here: :func:`cache_counts` reads torch_xla's counters
  (``PersistentCacheHit``, ``PersistentCacheMiss``, ``PersistentCacheDeserializeFailure``), the compile
  monitor's summary prints them, and :func:`warn_if_unreadable` warns once when executables were
  found in the folder but none could be read.
"""

from __future__ import annotations

import os
import warnings
from typing import Optional

#: Variable naming the folder of the persistent compilation cache (unset or empty: no cache).
CACHE_VARIABLE = "XLA_PLUGINS_COMPILE_CACHE"
#: Test switch: ``1`` turns the cache on also on PJRT CPU, so a test can show that nothing is read back there.
CPU_CACHE_TEST_SWITCH = "XLA_PLUGINS_TEST_CPU_COMPILE_CACHE"
#: torch_xla's counters of the persistent cache.
_COUNTERS = {
    "hits": "PersistentCacheHit",
    "misses": "PersistentCacheMiss",
    "unreadable": "PersistentCacheDeserializeFailure",
}

#: The folder this process's cache uses (``None``: no cache), once :func:`enable` ran.
_enabled: Optional[str] = None
_warned: set[str] = set()


class CompileCacheWarning(UserWarning):
    """The persistent compilation cache is not used (PJRT CPU) or could not read back what it found."""


def configured_folder() -> Optional[str]:
    """The folder named by :data:`CACHE_VARIABLE`, as an absolute path; ``None`` when unset or empty.

    Raises:
        ValueError: the path names something that is not a folder (a file, say); the message names the
            variable and the value.
    """
    text = os.environ.get(CACHE_VARIABLE, "").strip()
    if not text:
        return None
    folder = os.path.abspath(os.path.expanduser(text))
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ValueError(
            f"{CACHE_VARIABLE}={text!r} is not a folder: name a folder (made if missing) for torch_xla's persistent"
            " compilation cache, or leave the variable empty for none."
        )
    return folder


def enable(device_type: str) -> Optional[str]:
    """Turn torch_xla's persistent compilation cache on for :func:`configured_folder`, where it can read back.

    Call before the process compiles its first graph (idempotent: a second call returns the same folder).

    Args:
        device_type: the active PJRT device type (``torch_xla.runtime.device_type()``: ``"TPU"``, ``"CPU"``, ...).

    Returns:
        The folder in use, or ``None`` (no folder named, or PJRT CPU: then one :class:`CompileCacheWarning`).

    Raises:
        ValueError: the variable names something that is not a folder.
        RuntimeError: a folder is named but the process already compiled a graph with another cache
            setting (torch_xla reads it once, at its first compilation); the message says to set the
            variable before the run starts.
    """
    global _enabled
    folder = configured_folder()
    if folder is None or folder == _enabled:
        return _enabled if folder is not None else None
    if device_type == "CPU" and os.environ.get(CPU_CACHE_TEST_SWITCH) != "1":
        _warn_once(
            "cpu",
            f"{CACHE_VARIABLE}={folder}: the persistent compilation cache is not turned on for PJRT CPU, where"
            " torch_xla writes compiled executables but cannot read them back (measured with torch_xla 2.8 and"
            " 2.9: every graph compiles again). It is turned on for other PJRT devices (TPU).",
        )
        return None
    import torch_xla.runtime as xr

    from xla_plugins.runtime import _torch_xla_contract

    if _torch_xla_contract.computation_cache_is_initialized():
        if os.environ.get("XLA_PERSISTENT_CACHE_PATH") == folder:
            _enabled = folder
            return folder
        raise RuntimeError(
            f"{CACHE_VARIABLE}={folder} came too late: this process already compiled a graph, and torch_xla sets"
            " its compilation cache up once, at the first compilation. Set the variable before the run starts."
        )
    os.makedirs(folder, exist_ok=True)
    xr.initialize_cache(folder, readonly=False)
    _enabled = folder
    return folder


def enabled_folder() -> Optional[str]:
    """The folder of this process's persistent compilation cache, or ``None`` when it is not on."""
    return _enabled


def cache_counts() -> Optional[dict[str, int]]:
    """torch_xla's counts of the persistent cache in this process (``hits``, ``misses``, ``unreadable``); ``None``
    when the cache is not on. Reads ``torch_xla.debug.metrics`` (no device work)."""
    if _enabled is None:
        return None
    import torch_xla.debug.metrics as met

    return {key: int(met.counter_value(name) or 0) for key, name in _COUNTERS.items()}


def warn_if_unreadable() -> None:
    """One :class:`CompileCacheWarning` per process when the cache found executables but could read none back."""
    counts = cache_counts()
    if counts and counts["unreadable"] and not counts["hits"]:
        _warn_once(
            "unreadable",
            f"The persistent compilation cache in {_enabled} held {counts['unreadable']} executable(s) for this run"
            " but torch_xla could read none of them back on this device, so it saved no compilation. Unset"
            f" {CACHE_VARIABLE} here.",
        )


def _warn_once(key: str, text: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(text, CompileCacheWarning, stacklevel=3)


__all__ = [
    "CACHE_VARIABLE",
    "CPU_CACHE_TEST_SWITCH",
    "CompileCacheWarning",
    "cache_counts",
    "configured_folder",
    "enable",
    "enabled_folder",
    "warn_if_unreadable",
]
