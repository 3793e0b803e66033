"""Controls: which plugins load and what ``"auto"`` means, from environment variables or from code.

Code sets the same environment variables (:func:`configure`), so a control set in the parent process
also holds in worker processes that Lightning or torch_xla spawn or fork. The plugin manager reads
the controls once, before any plugin is imported, so a plugin cannot rewrite them for its process.

This module sits below the plugin manager: :func:`configure` tells the layers above that the
controls changed through the callbacks registered with :func:`on_change`, never by importing them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Optional, Union

from packaging.utils import canonicalize_name

from _trainer_plugins_autoload import AUTOLOAD_VARIABLE, autoload_enabled

#: Prefix of every control variable (a plugin changing one at import is undone and reported).
PREFIX = "TRAINER_PLUGINS_"
BLOCK_VARIABLE = "TRAINER_PLUGINS_BLOCK"
#: Seconds a plugin's availability probe may take before the plugin counts as not available.
PROBE_TIMEOUT_VARIABLE = "TRAINER_PLUGINS_PROBE_TIMEOUT"
#: Default of :data:`PROBE_TIMEOUT_VARIABLE`: probes must not start a runtime, so a few seconds is ample.
DEFAULT_PROBE_TIMEOUT_S = 5.0
ALLOW_VARIABLE = "TRAINER_PLUGINS_ALLOW"
#: Roles whose ``"auto"`` choice can be pinned, and the variable that pins each one.
PIN_VARIABLES = {
    "accelerator": "TRAINER_PLUGINS_PIN_ACCELERATOR",
    "strategy": "TRAINER_PLUGINS_PIN_STRATEGY",
    "environment": "TRAINER_PLUGINS_PIN_ENVIRONMENT",
}


#: The value of ``TRAINER_PLUGINS_ALLOW`` (and ``configure(allow=...)``) that allows every plugin.
ALLOW_ALL = "*"


class ControlError(ValueError):
    """A control variable holds a value that cannot be read; the message names it and the accepted values."""


def _probe_timeout(value: Optional[str]) -> float:
    """Seconds from ``TRAINER_PLUGINS_PROBE_TIMEOUT`` (unset or empty: the default)."""
    if value is None or not value.strip():
        return DEFAULT_PROBE_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ControlError(
            f"{PROBE_TIMEOUT_VARIABLE}={value!r} is not understood; use a positive number of seconds"
            f" (default {DEFAULT_PROBE_TIMEOUT_S:g})"
        )
    return seconds


def read_pins(environ: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """Role -> pinned name from the ``TRAINER_PLUGINS_PIN_*`` variables of ``environ`` (default ``os.environ``)."""
    env = os.environ if environ is None else environ
    return {role: env[var].strip().lower() for role, var in PIN_VARIABLES.items() if env.get(var, "").strip()}


def _names(value: Optional[str]) -> frozenset[str]:
    """Canonical names (PEP 503: lower case, ``-``/``_``/``.`` alike) of a comma-separated list."""
    return frozenset(canonicalize_name(part.strip()) for part in (value or "").split(",") if part.strip())


@dataclass(frozen=True)
class Controls:
    """The switches a user or administrator sets; see the table in ``docs/controls.md``.

    Args:
        autoload: patch ``lightning.Trainer``/``Fabric`` automatically when Lightning is imported.
        block: plugin names (entry-point names) or distribution names never loaded. Names compare
            as PEP 503 does: case and ``-``/``_``/``.`` do not matter.
        allow: if not ``None``, only these plugin or distribution names are loaded.
        pins: role -> name that ``"auto"`` means for that role (``{"accelerator": "cpu"}``).
        probe_timeout: seconds a plugin's availability probe may take (``> 0``).
    """

    autoload: bool = True
    block: frozenset[str] = frozenset()
    allow: Optional[frozenset[str]] = None
    pins: Mapping[str, str] = field(default_factory=dict)
    probe_timeout: float = DEFAULT_PROBE_TIMEOUT_S

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None, strict_autoload: bool = True) -> Controls:
        """Read the controls from ``environ`` (default ``os.environ``).

        Args:
            environ: the variables to read (default ``os.environ``).
            strict_autoload: raise for an unreadable ``TRAINER_PLUGINS_AUTOLOAD``; ``False`` reads it
                as off (the plugin manager, for which it does not matter, never fails on it).

        Raises:
            ControlError: ``TRAINER_PLUGINS_AUTOLOAD`` is not a boolean word or
                ``TRAINER_PLUGINS_PROBE_TIMEOUT`` not a positive number; the message names the
                variable, its value and the accepted values.
        """
        env = os.environ if environ is None else environ
        allow = env.get(ALLOW_VARIABLE)
        pins = read_pins(env)
        try:
            autoload = autoload_enabled(env.get(AUTOLOAD_VARIABLE))
        except ValueError as error:
            if strict_autoload:
                raise ControlError(str(error)) from None
            autoload = False
        return cls(
            autoload=autoload,
            block=_names(env.get(BLOCK_VARIABLE)),
            allow=None if allow is None or allow.strip() == ALLOW_ALL else _names(allow),
            pins=pins,
            probe_timeout=_probe_timeout(env.get(PROBE_TIMEOUT_VARIABLE)),
        )

    def admits(self, *names: Optional[str]) -> Optional[str]:
        """Why a plugin known by any of ``names`` must not load, or ``None`` when it may load."""
        known = {canonicalize_name(name) for name in names if name}
        blocked = known & self.block
        if blocked:
            return f"blocked by {BLOCK_VARIABLE} ({', '.join(sorted(blocked))})"
        if self.allow is not None and not known & self.allow:
            return f"not in {ALLOW_VARIABLE} ({', '.join(sorted(self.allow)) or 'empty'})"
        return None


_listeners: list[Callable[[], None]] = []


def on_change(callback: Callable[[], None]) -> None:
    """Call ``callback`` whenever :func:`configure` changes the controls (the plugin manager's reset)."""
    if callback not in _listeners:
        _listeners.append(callback)


def configure(
    *,
    autoload: Optional[bool] = None,
    block: Optional[Union[str, Iterable[str]]] = None,
    allow: Optional[Union[str, Iterable[str]]] = None,
    pins: Optional[Mapping[str, Optional[str]]] = None,
    probe_timeout: Optional[float] = None,
) -> Controls:
    """Set controls from code; ``None`` leaves a control as it is.

    The values are written to the environment variables of :class:`Controls` (so spawned workers
    see them) and the plugin set is rebuilt on next use.

    Args:
        autoload: ``False`` stops automatic patching in processes started from now on; in this
            process call :func:`trainer_plugins.uninstall` as well.
        block: plugin or distribution names to block (replaces the current list); a string is
            read like the environment variable, comma-separated.
        allow: plugin or distribution names to allow exclusively (``[]`` allows none,
            ``"*"`` allows all again).
        pins: role -> name; a ``None`` value removes that pin.
        probe_timeout: seconds a plugin's availability probe may take (``> 0``).

    Returns:
        The controls now in force.

    Raises:
        ValueError: a pin names an unknown role; the message lists the pinnable roles.
        ControlError: ``probe_timeout`` is not a positive number.
    """
    for role in pins or {}:
        if role not in PIN_VARIABLES:
            raise ValueError(f"cannot pin role {role!r}; pinnable roles are {', '.join(PIN_VARIABLES)}")
    if probe_timeout is not None:
        _probe_timeout(str(probe_timeout))
        os.environ[PROBE_TIMEOUT_VARIABLE] = str(probe_timeout)
    if autoload is not None:
        os.environ[AUTOLOAD_VARIABLE] = "1" if autoload else "0"
    if block is not None:
        os.environ[BLOCK_VARIABLE] = block if isinstance(block, str) else ",".join(block)
    if allow is not None:
        os.environ[ALLOW_VARIABLE] = allow if isinstance(allow, str) else ",".join(allow)
    for role, name in (pins or {}).items():
        if name is None:
            os.environ.pop(PIN_VARIABLES[role], None)
        else:
            os.environ[PIN_VARIABLES[role]] = name
    for callback in _listeners:
        callback()
    return Controls.from_env()
