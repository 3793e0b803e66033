"""Controls: which plugins load and what ``"auto"`` means, from environment variables or from code.

Code sets the same environment variables (:func:`configure`), so a control set in the parent process
also holds in worker processes that Lightning or torch_xla spawn or fork.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Optional, Union

from packaging.utils import canonicalize_name

from _trainer_plugins_autoload import AUTOLOAD_VARIABLE, autoload_enabled

BLOCK_VARIABLE = "TRAINER_PLUGINS_BLOCK"
ALLOW_VARIABLE = "TRAINER_PLUGINS_ALLOW"
#: Roles whose ``"auto"`` choice can be pinned, and the variable that pins each one.
PIN_VARIABLES = {
    "accelerator": "TRAINER_PLUGINS_PIN_ACCELERATOR",
    "strategy": "TRAINER_PLUGINS_PIN_STRATEGY",
    "environment": "TRAINER_PLUGINS_PIN_ENVIRONMENT",
}


#: The value of ``TRAINER_PLUGINS_ALLOW`` (and ``configure(allow=...)``) that allows every plugin.
ALLOW_ALL = "*"


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
    """

    autoload: bool = True
    block: frozenset[str] = frozenset()
    allow: Optional[frozenset[str]] = None
    pins: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> Controls:
        """Read the controls from ``environ`` (default ``os.environ``).

        Raises:
            ValueError: ``TRAINER_PLUGINS_AUTOLOAD`` is not a boolean word, naming the value.
        """
        env = os.environ if environ is None else environ
        allow = env.get(ALLOW_VARIABLE)
        pins = {role: env[var].strip().lower() for role, var in PIN_VARIABLES.items() if env.get(var, "").strip()}
        return cls(
            autoload=autoload_enabled(env.get(AUTOLOAD_VARIABLE)),
            block=_names(env.get(BLOCK_VARIABLE)),
            allow=None if allow is None or allow.strip() == ALLOW_ALL else _names(allow),
            pins=pins,
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


def configure(
    *,
    autoload: Optional[bool] = None,
    block: Optional[Union[str, Iterable[str]]] = None,
    allow: Optional[Union[str, Iterable[str]]] = None,
    pins: Optional[Mapping[str, Optional[str]]] = None,
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

    Returns:
        The controls now in force.

    Raises:
        ValueError: a pin names an unknown role; the message lists the pinnable roles.
    """
    from trainer_plugins._manager import reset_plugin_manager

    for role in pins or {}:
        if role not in PIN_VARIABLES:
            raise ValueError(f"cannot pin role {role!r}; pinnable roles are {', '.join(PIN_VARIABLES)}")
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
    reset_plugin_manager()
    return Controls.from_env()
