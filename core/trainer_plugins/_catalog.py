"""The catalogue: every name the plugins declared, with name conflicts resolved by a fixed rule.

Conflict rule (documented in ``docs/controls.md``): a name claimed more than once goes to the one
claimant that declared ``override=True``. Without an override, a Lightning built-in name stays
Lightning's and two plugins claiming the same name both lose it: selecting it raises
:class:`PluginConflictError` naming both distributions. Every conflict is reported by
``trainer-plugins list``; nothing is shadowed silently.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

from trainer_plugins._entries import _Entry
from trainer_plugins._errors import USER_ERRORS, PluginError, PluginWarning
from trainer_plugins._guard import guard
from trainer_plugins._hookspecs import DECLARATION_HOOKS
from trainer_plugins._manager import PluginManager
from trainer_plugins._records import BUILTIN_PLUGIN, PluginRecord
from trainer_plugins._singleton import get_plugin_manager, on_reset
from trainer_plugins._standalone import PACKAGES


class PluginConflictError(PluginError):
    """A name is claimed by several plugins and none of them declared ``override=True``."""


@dataclass(frozen=True)
class Claim:
    """A plugin's claim on one name of one role.

    Attributes:
        name: the name claimed (the entry's name or one of its aliases).
        entry: the declaration it comes from.
        plugin: the record of the declaring plugin.
    """

    name: str
    entry: _Entry
    plugin: PluginRecord

    @property
    def deprecated(self) -> bool:
        """Whether ``name`` is one of the entry's deprecated aliases."""
        return self.name in self.entry.deprecated_aliases

    @property
    def builtin(self) -> bool:
        """Whether the claim is Lightning's own."""
        return self.plugin.name == BUILTIN_PLUGIN

    @property
    def live(self) -> bool:
        """Whether the claiming plugin is loaded (a quarantined plugin's claims take no effect)."""
        return self.plugin.state == "loaded"

    def load(self, api: str, package: str) -> Any:
        """The class of this claim for ``api`` and Lightning ``package``, imported under its plugin's guard.

        Raises:
            ModuleNotFoundError: a module the class needs is not installed (a missing runtime); the
                message names the plugin and its distribution.
            PluginError: the class cannot be imported otherwise or is not of its role's Lightning
                base class; the message names the plugin and its distribution.
        """
        action = f"loading {self.entry.role} class {self.entry.class_path(api)}"
        return guard(self.plugin, action, self.entry.load, api, package, passthrough=(ModuleNotFoundError,))

    def build(self, api: str, package: str, **kwargs: Any) -> Any:
        """An instance of this claim's class (:meth:`load`), built with the entry's ``init_kwargs`` and ``kwargs``.

        Raises:
            ValueError, TypeError, NotImplementedError, ModuleNotFoundError: the constructor rejected
                the run (a bad setting, a missing runtime); passed on unchanged, like a decision
                hook's (a note in the traceback names the plugin).
            Exception: anything else the constructor raised, of the same type, with the plugin and
                its distribution named in front of the message.
            PluginError: the constructor raised something else (``SystemExit``, ...).
        """
        cls = self.load(api, package)
        arguments = {**getattr(self.entry, "init_kwargs", {}), **kwargs}
        return guard(
            self.plugin, f"{cls.__qualname__}()", cls, passthrough=(Exception,), unchanged=USER_ERRORS, **arguments
        )


@dataclass
class Conflict:
    """Several claims on one name; ``winner`` is ``None`` when nobody may use the name."""

    role: str
    name: str
    claims: list[Claim]
    winner: Optional[Claim] = None

    def describe(self) -> str:
        """One line naming every claimant's distribution and the outcome."""
        claimants = {claim.plugin.label for claim in self.claims}
        if len(claimants) == 1:
            return (
                f"{self.role} {self.name!r} is declared {len(self.claims)} times by {claimants.pop()}, so the name is"
                " unusable: declare it once (one entry takes both trainer= and fabric=)"
            )
        who = ", ".join(claim.plugin.label for claim in self.claims)
        if self.winner is None:
            overriding = [c.plugin.label for c in self.claims if c.entry.override and not c.builtin and c.live]
            if len(overriding) > 1:
                return (
                    f"{self.role} {self.name!r} is claimed by {who}; {' and '.join(overriding)} all declared"
                    " override=True, so none wins and the name is unusable"
                )
            return (
                f"{self.role} {self.name!r} is claimed by {who}; none declared override=True, so the name is unusable"
            )
        return f"{self.role} {self.name!r} is claimed by {who}; {self.winner.plugin.label} wins"

    def settle(self) -> str:
        """How to pick one plugin for a name nobody wins ('' when one wins): its own name, or block the others.

        For each plugin claimant: ``role='its other name'`` selects it for one run, and
        ``TRAINER_PLUGINS_BLOCK`` naming every other claimant's distribution gives it the name.
        """
        plugins = [claim for claim in self.claims if not claim.builtin]
        if self.winner is not None or len({claim.plugin.name for claim in plugins}) < 2:
            return ""
        ways = []
        for claim in plugins:
            others = [c.plugin.distribution or c.plugin.name for c in plugins if c.plugin.name != claim.plugin.name]
            own = [name for name in claim.entry.names if name != self.name]
            pick = f"{self.role}={own[0]!r}, or " if own else ""
            ways.append(f"for {claim.plugin.label}: {pick}TRAINER_PLUGINS_BLOCK={','.join(sorted(others))}")
        return f"{self.name!r} serves none of them; " + "; ".join(ways)


@dataclass
class Catalog:
    """Name -> claim for each role, built from the declaration hooks of a plugin manager.

    Attributes:
        claims: role -> name -> the winning claim.
        conflicts: names claimed by more than one plugin, with the outcome.
        declared: plugin name -> every claim it made, won or lost (for listings).
    """

    manager: PluginManager
    claims: dict[str, dict[str, Claim]] = field(default_factory=dict)
    conflicts: list[Conflict] = field(default_factory=list)
    declared: dict[str, list[Claim]] = field(default_factory=dict)

    @classmethod
    def build(cls, manager: PluginManager) -> Catalog:
        """Ask every plugin for its declarations and resolve conflicts (see the module docstring).

        Conflicts are resolved once every role is declared, so a plugin quarantined while
        declaring a later role (a raising hook, a malformed answer) wins no name in any role.
        """
        catalog = cls(manager)
        wanted: dict[str, dict[str, list[Claim]]] = {}
        for role, hook in DECLARATION_HOOKS.items():
            wanted[role] = {}
            for record, entries in manager.call_each(hook):
                for entry in entries:
                    for name in entry.names:
                        claim = Claim(name, entry, record)
                        wanted[role].setdefault(name, []).append(claim)
                        catalog.declared.setdefault(record.name, []).append(claim)
        for role, names in wanted.items():
            catalog.claims[role] = {}
            for name, claims in names.items():
                winner = catalog._resolve(role, name, claims)
                if winner is not None:
                    catalog.claims[role][name] = winner
        return catalog

    def _resolve(self, role: str, name: str, claims: list[Claim]) -> Optional[Claim]:
        if len(claims) == 1:
            return claims[0]
        live = [claim for claim in claims if claim.plugin.state == "loaded"]
        overriding = [claim for claim in live if claim.entry.override and not claim.builtin]
        builtin = [claim for claim in live if claim.builtin]
        if len(overriding) == 1:
            winner: Optional[Claim] = overriding[0]
        elif not overriding and builtin:
            winner = builtin[0]
        else:
            winner = None
        if len({claim.plugin.name for claim in claims}) == 1:
            winner = None  # one plugin declaring a name twice: a bug in the plugin, not a contest
        conflict = Conflict(role, name, sorted(claims, key=lambda c: (not c.builtin, c.plugin.name)), winner)
        self.conflicts.append(conflict)
        if winner is None or winner.builtin:
            warnings.warn(f"trainer-plugins: {conflict.describe()}", PluginWarning, stacklevel=4)
        return winner

    # --- lookups ---------------------------------------------------------------------------------

    def names(self, role: str, api: str, include_deprecated: bool = False) -> list[str]:
        """Sorted usable names of ``role`` that have a class for ``api``."""
        return sorted(
            name
            for name, claim in self.claims.get(role, {}).items()
            if claim.entry.class_path(api) is not None and (include_deprecated or not claim.deprecated)
        )

    def find(self, role: str, name: str) -> Optional[Claim]:
        """The claim that owns ``name`` for ``role`` or ``None``.

        A plugin quarantined after the catalogue was built loses its names: Lightning's own claim
        on the name, if any, takes over; otherwise its claim is returned so that selecting the name
        reports the quarantine.

        Raises:
            PluginConflictError: ``name`` is contested and unusable; the message names both claimants.
        """
        claim = self.claims.get(role, {}).get(name)
        if claim is not None and not claim.live:
            for conflict in self.conflicts:
                if conflict.role == role and conflict.name == name:
                    claim = next((c for c in conflict.claims if c.builtin and c.live), claim)
        if claim is None:
            for conflict in self.conflicts:
                if conflict.role == role and conflict.name == name and conflict.winner is None:
                    how = (
                        conflict.settle() or "Block one of them (TRAINER_PLUGINS_BLOCK) or ask its author to rename it"
                    )
                    raise PluginConflictError(f"{conflict.describe()}. {how}.")
        return claim

    def _claims_by_class(self, role: str, api: str) -> dict[type, list[Claim]]:
        """Loaded class -> the claims naming it (plugin claims first); never imports."""
        by_class: dict[type, list[Claim]] = {}
        for claim in self.claims.get(role, {}).values():
            if not claim.live:
                continue
            for package in PACKAGES:  # Lightning's unified and standalone packagings have their own classes
                cls = claim.entry.loaded_class(api, package)
                if cls is not None and claim not in by_class.get(cls, []):
                    by_class.setdefault(cls, []).append(claim)
        for claims in by_class.values():
            claims.sort(key=lambda claim: claim.builtin)
        return by_class

    def owner_of(self, obj: Any, role: str, api: str) -> Optional[Claim]:
        """A claim whose class is the closest class of ``obj`` (walking its MRO), a plugin's first."""
        by_class = self._claims_by_class(role, api)
        return next((by_class[cls][0] for cls in type(obj).__mro__ if cls in by_class), None)

    def name_of(self, obj: Any, role: str, api: str) -> Optional[str]:
        """The registered name of ``obj``'s own class, if exactly one entry names that class."""
        names = {claim.entry.name for claim in self._claims_by_class(role, api).get(type(obj), [])}
        return names.pop() if len(names) == 1 else None

    def auto_candidates(self, api: str) -> list[tuple[int, str, Claim]]:
        """``(priority, name, claim)`` of each loaded accelerator ``"auto"`` may pick for ``api``, best first.

        An accelerator is a candidate under its main name when its entry has an ``auto_priority``.
        """
        candidates = []
        for name, claim in self.claims.get("accelerator", {}).items():
            priority = getattr(claim.entry, "auto_priority", None)
            usable = claim.live and claim.entry.class_path(api) is not None
            if name == claim.entry.name and priority is not None and usable:
                candidates.append((priority, name, claim))
        return sorted(candidates, key=lambda candidate: -candidate[0])

    def quarantine_note(self) -> str:
        """A sentence naming the quarantined plugins with their errors ('' if none), for error messages."""
        broken = self.manager.quarantined()
        if not broken:
            return ""
        return " Quarantined plugins: " + "; ".join(f"{record.label}: {record.reason}" for record in broken) + "."


_lock = threading.Lock()
_catalogs: dict[int, Catalog] = {}


def get_catalog() -> Catalog:
    """The catalogue of the process-wide plugin manager (built once, see ``reset_plugin_manager``)."""
    manager = get_plugin_manager()
    with _lock:
        catalog = _catalogs.get(id(manager))
        if catalog is None or catalog.manager is not manager:
            catalog = _catalogs[id(manager)] = Catalog.build(manager)
        return catalog


def reset_catalogs() -> None:
    """Forget cached catalogues."""
    with _lock:
        _catalogs.clear()


on_reset(reset_catalogs)
