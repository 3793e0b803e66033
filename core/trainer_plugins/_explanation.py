"""The explanation of a run: one :class:`Decision` per role, the table, and the one start-up line."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Optional

from trainer_plugins._records import BUILTIN_PLUGIN, PluginRecord

#: The reason recorded where no plugin answered and Lightning's own method decided.
LIGHTNING_RULE = "Lightning's own rule (no plugin claims this)"
#: Roles the start-up line names, and the longest line it may be (characters).
STARTUP_ROLES = ("accelerator", "strategy", "precision", "environment")
STARTUP_LINE_LIMIT = 120


@dataclass(frozen=True)
class Decision:
    """How one role of a run was filled.

    Attributes:
        role: ``"accelerator"``, ``"devices"``, ``"environment"``, ``"strategy"``, ``"precision"`` or
            ``"is_distributed"``.
        choice: the object chosen, as ``"name (module.Class)"`` or a value.
        plugin: the plugin that supplied it, as ``"name (distribution version)"``.
        reason: why (availability, priority, pin, declared compatibility, ...).
    """

    role: str
    choice: str
    plugin: str
    reason: str


class Explanation(list):  # type: ignore[type-arg]
    """The decisions of one run, in the order they were taken; ``str()`` gives a readable table."""

    def note(self, role: str, choice: str, plugin: str, reason: str) -> None:
        """Record a decision.

        A second note for a role already decided (the object built from a chosen name) only
        refines the recorded choice; the first decision's plugin and reason stay.
        """
        for index, decision in enumerate(self):
            if decision.role == role:
                self[index] = Decision(role, choice, decision.plugin, decision.reason)
                return
        self.append(Decision(role, choice, plugin, reason))

    def add_reason(self, role: str, text: str) -> None:
        """Append ``text`` to the reason of ``role``'s decision (nothing when ``text`` is empty)."""
        for index, decision in enumerate(self):
            if decision.role == role and text:
                self[index] = Decision(role, decision.choice, decision.plugin, f"{decision.reason}; {text}")

    def as_dicts(self) -> list[dict[str, str]]:
        """The decisions as plain dictionaries (for JSON)."""
        return [asdict(decision) for decision in self]

    def startup_line(self, records: Iterable[PluginRecord]) -> Optional[str]:
        """The one line a run logs at start-up, or ``None`` when no plugin supplied a role.

        Names each role a plugin of ``records`` (not Lightning, not trainer-plugins' own fallback)
        supplied, grouped by distribution: ``"trainer-plugins: accelerator=npu, strategy=npu_ddp
        from my-npu 0.1.0"``. At most :data:`STARTUP_LINE_LIMIT` characters (cut with ``"..."``);
        the full table is :func:`trainer_plugins.explain` and the DEBUG log.
        """
        sources = {
            record.label: f"{record.distribution} {record.version}" if record.distribution else record.name
            for record in records
            if record.name != BUILTIN_PLUGIN
        }
        supplied: dict[str, list[str]] = {}
        for decision in self:
            if decision.role in STARTUP_ROLES and decision.plugin in sources:
                name = decision.choice.split(" (")[0]
                supplied.setdefault(sources[decision.plugin], []).append(f"{decision.role}={name}")
        if not supplied:
            return None
        line = "trainer-plugins: " + "; ".join(f"{', '.join(roles)} from {who}" for who, roles in supplied.items())
        return line if len(line) <= STARTUP_LINE_LIMIT else line[: STARTUP_LINE_LIMIT - 3] + "..."

    def __str__(self) -> str:
        width = max((len(d.role) for d in self), default=0)
        return "\n".join(f"{d.role:<{width}}  {d.choice}  <- {d.plugin}: {d.reason}" for d in self)


def describe(obj: Any) -> str:
    """``"module.Class"`` for an object, or ``repr`` for a plain value."""
    if isinstance(obj, (str, int, float, bool, list, tuple)) or obj is None:
        return repr(obj)
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"
