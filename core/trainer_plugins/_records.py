"""What the plugin manager keeps: a record per plugin, what plugins said in one run, and one hook answer."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Optional

#: Name of the built-in plugin that describes Lightning's own accelerators and strategies.
BUILTIN_PLUGIN = "lightning"


@dataclass
class PluginRecord:
    """What the manager knows about one plugin.

    Attributes:
        name: the plugin name (its entry-point name; ``"lightning"`` for the built-in plugin).
        value: what the entry point points at (``"package.module"``).
        distribution: the distribution that ships it (``None`` when registered from code).
        version: that distribution's version.
        state: ``"loaded"``, ``"quarantined"`` or ``"blocked"``.
        reason: why it is in that state (empty when loaded).
        error: the exception that quarantined it, if any.
        api: the ``TRAINER_PLUGINS_API`` specifier it declared.
        plugin: the plugin object (the module the entry point names).
        hooks: the guarded hook functions registered with pluggy in its place (``None`` until registered).
        output: what the plugin printed to stdout while importing or declaring (captured, never printed).
        environ_changes: variable -> (value before, value after) for each ``os.environ`` change made
            while importing it.
        unavailable: why its availability probe failed in the latest run that asked ('' if it did not).
        pending: the thread of an abandoned call that has not returned yet (``None`` if there is none);
            the plugin is not called again until it ends.
    """

    name: str
    value: str
    distribution: Optional[str] = None
    version: Optional[str] = None
    state: str = "loaded"
    reason: str = ""
    error: Optional[BaseException] = None
    api: Optional[str] = None
    plugin: Any = field(default=None, repr=False, compare=False)
    hooks: Any = field(default=None, repr=False, compare=False)
    output: str = ""
    environ_changes: dict[str, tuple[Optional[str], Optional[str]]] = field(default_factory=dict)
    unavailable: str = ""
    pending: Optional[threading.Thread] = field(default=None, repr=False, compare=False)

    @property
    def label(self) -> str:
        """``"name (distribution version)"`` for messages."""
        if self.distribution is None:
            return self.name
        return f"{self.name} ({self.distribution} {self.version})"


@dataclass
class Run:
    """What the plugins said during one run (one ``Trainer``/``Fabric`` connector).

    A plugin whose availability probe fails or does not answer in time is "not available" for the
    run that asked, and only for it: the next run asks again.

    Attributes:
        unavailable: plugin name -> why it is not available for this run.
        answers: accelerator name -> whether it is available, as already answered in this run.
    """

    unavailable: dict[str, str] = field(default_factory=dict)
    answers: dict[str, bool] = field(default_factory=dict)


@dataclass(frozen=True)
class Answer:
    """A non-``None`` result of one hook implementation, with the record of the plugin that gave it.

    This is what the guarded implementations return through pluggy, so pluggy's tracing and call
    monitoring show which plugin answered.
    """

    plugin: PluginRecord
    value: Any

    def __repr__(self) -> str:
        return f"Answer({self.plugin.name}: {self.value!r})"
