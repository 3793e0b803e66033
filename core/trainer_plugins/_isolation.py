"""Keeping a plugin's side effects in check: a time bound on its probes, its prints, its environment changes.

Each helper records what it saw on the plugin's :class:`~trainer_plugins._records.PluginRecord`
(``pending``, ``output``, ``environ_changes``); judging the plugin is the guard's job.
"""

from __future__ import annotations

import io
import os
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, redirect_stdout
from typing import Any, Optional

from trainer_plugins._controls import PREFIX as CONTROL_PREFIX
from trainer_plugins._controls import PROBE_TIMEOUT_VARIABLE
from trainer_plugins._errors import PluginWarning, ProbeTimeout
from trainer_plugins._records import PluginRecord


def bounded_call(record: PluginRecord, function: Callable[..., Any], args: Any, kwargs: Any, timeout: float) -> Any:
    """``function(*args, **kwargs)`` in a daemon thread, abandoned after ``timeout`` seconds.

    Python cannot stop a thread, so an abandoned call runs on (kept as ``record.pending``); until it
    ends, the plugin is not called again (a wedged device driver would only pile up threads).

    Raises:
        ProbeTimeout: no answer within ``timeout`` seconds, or an earlier abandoned call still runs.
        BaseException: what ``function`` raised, re-raised in the calling thread.
    """
    if record.pending is not None and record.pending.is_alive():
        raise ProbeTimeout(f"a call from an earlier run has still not answered ({PROBE_TIMEOUT_VARIABLE})")
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = function(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001 - handed to the guard in the calling thread
            outcome["error"] = error

    thread = threading.Thread(target=target, name=f"trainer-plugins probe of {record.name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        record.pending = thread
        raise ProbeTimeout(f"no answer within {timeout:g} s ({PROBE_TIMEOUT_VARIABLE})")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


@contextmanager
def captured_output(record: PluginRecord, capture: bool = True) -> Iterator[None]:
    """Keep what the plugin prints to stdout in ``record.output`` instead of the process's stdout."""
    if not capture:
        yield
        return
    buffer = io.StringIO()
    try:
        with redirect_stdout(buffer):
            yield
    finally:
        record.output += buffer.getvalue()


@contextmanager
def watched_import(record: PluginRecord) -> Iterator[None]:
    """Import-time watch: capture stdout, and record (and report) what the plugin changed in ``os.environ``.

    Changes to our own controls (``TRAINER_PLUGINS_*``) are undone: they were read before plugins
    loaded, and workers must not inherit a plugin's rewrite either.
    """
    before = dict(os.environ)
    try:
        with captured_output(record):
            yield
    finally:
        changed = {
            key: (before.get(key), os.environ.get(key))
            for key in set(before) | set(os.environ)
            if before.get(key) != os.environ.get(key)
        }
        for key, (old, _) in changed.items():
            if key.startswith(CONTROL_PREFIX):
                if old is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = old
        if changed:
            record.environ_changes = changed
            warnings.warn(
                f"trainer-plugins: plugin {record.label} changed os.environ while importing:"
                f" {describe_changes(changed)}",
                PluginWarning,
                stacklevel=5,
            )


def describe_changes(changed: Mapping[str, tuple[Optional[str], Optional[str]]]) -> str:
    """``"NAME: 'old' -> 'new'"`` for each changed variable; controls are marked as undone."""
    parts = []
    for key in sorted(changed):
        old, new = changed[key]
        text = f"{key}: {'unset' if old is None else repr(old)} -> {'unset' if new is None else repr(new)}"
        if key.startswith(CONTROL_PREFIX):
            text += " (undone: trainer-plugins controls are read before plugins load)"
        parts.append(text)
    return "; ".join(parts)
