"""Name checks: which role names a run may use, looked up in the catalogue for one api (Trainer or Fabric).

Lightning checks names against its own registries and words its own errors; these functions add
what the plugins declared (:mod:`trainer_plugins._catalog`) without rephrasing Lightning. An unknown
name is left to Lightning's check.
"""

from __future__ import annotations

from typing import Any, Optional

from lightning.fabric.utilities.rank_zero import rank_zero_deprecation

from trainer_plugins._catalog import Catalog, Claim
from trainer_plugins._entries import APIS

#: How messages name each api.
API_NAMES = {"trainer": "Trainer", "fabric": "Fabric"}
#: Flag values Lightning itself interprets for each role (never looked up in the catalogue).
KEYWORDS = {"accelerator": ("auto", "gpu"), "strategy": ("auto",)}


def check_name(catalog: Catalog, api: str, role: str, flag: Any, lightning_names: list[str]) -> None:
    """Refuse a name that plugins contest or that exists only for the other API; unknown names are
    left to Lightning's own check.

    Args:
        catalog: the declared names.
        api: ``"trainer"`` or ``"fabric"``.
        role: ``"accelerator"`` or ``"strategy"``.
        flag: the user's flag (a name or an instance).
        lightning_names: the names Lightning's own registry holds for ``role``.

    Raises:
        PluginConflictError: ``flag`` is claimed by plugins without an override; the message
            names the claimants.
        ValueError: ``flag`` names an entry with a class for the other API only (Trainer vs
            Fabric); the message says so.
    """
    if isinstance(flag, str) and flag.lower() not in KEYWORDS[role] and flag not in lightning_names:
        catalog.find(role, flag.lower())
        if flag.lower() not in catalog.names(role, api, include_deprecated=True):
            _check_other_api(catalog, api, role, flag)


def _check_other_api(catalog: Catalog, api: str, role: str, flag: str) -> None:
    """Reject a name that exists only for the other API (Trainer vs Fabric), saying so.

    Raises:
        ValueError: ``flag`` names a ``role`` entry with a class for the other API only.
    """
    other = next(each for each in APIS if each != api)
    claim = catalog.claims.get(role, {}).get(flag.lower())
    if claim is None or claim.entry.class_path(other) is None:
        return
    raise ValueError(
        f"`{role}={flag!r}` is for the {API_NAMES[other]} only: {claim.plugin.label} provides no"
        f" {API_NAMES[api]} class for this {role}. Use it with lightning.{API_NAMES[other]}, or choose one"
        f" of the {API_NAMES[api]}'s names: {', '.join((*KEYWORDS[role], *catalog.names(role, api)))}."
    )


def valid_names(catalog: Catalog, api: str, role: str, lightning_names: list[str]) -> list[str]:
    """The names Lightning's own check accepts for ``role``: Lightning's, then the plugins' (each once).

    Deprecated plugin names are included: selecting one works (with a deprecation warning).
    """
    plugin_names = catalog.names(role, api, include_deprecated=True)
    return list(dict.fromkeys([*lightning_names, *plugin_names]))


def extend_name_error(catalog: Catalog, api: str, role: str, message: str, lightning_names: list[str]) -> str:
    """Lightning's message for an invalid ``role`` name, with what plugins add appended (never rephrased).

    Lightning's accelerator message already lists every valid name (:func:`valid_names`); its
    strategy message lists examples only, so the plugins' strategy names are appended. The
    quarantined plugins, if any, end the message.
    """
    added = [name for name in valid_names(catalog, api, role, lightning_names) if name not in lightning_names]
    if role == "strategy" and added:
        message += f" Strategies from installed plugins: {', '.join(added)}."
    return message + catalog.quarantine_note()


def canonical(catalog: Catalog, role: str, flag: Any) -> Any:
    """The main name of the entry a plugin-provided name belongs to (deprecated aliases warn)."""
    if not isinstance(flag, str):
        return flag
    claim = catalog.find(role, flag.lower())
    if claim is None or claim.builtin:
        return flag
    if claim.deprecated:
        rank_zero_deprecation(f"The {role} name {flag!r} is deprecated. Use `{role}={claim.entry.name!r}` instead.")
    return claim.entry.name


def plugin_claim(catalog: Catalog, role: str, name: Any) -> Optional[Claim]:
    """The plugin (not built-in) claim on ``name``, or ``None``.

    Raises:
        PluginError: the claiming plugin is quarantined; the message names its distribution,
            version and original exception.
        PluginConflictError: the name is contested by plugins without an override.
    """
    if not isinstance(name, str):
        return None
    claim = catalog.find(role, name.lower())
    if claim is None or claim.builtin:
        return None
    if claim.plugin.state != "loaded":
        raise catalog.manager.error_for(claim.plugin, f"provide {role} {name!r}")
    return claim


def plugin_strategy_names(catalog: Catalog, api: str, plugin: Any, supports_compile: bool = False) -> list[str]:
    """The main names of ``plugin``'s loaded strategies that have a class for ``api``, sorted.

    Args:
        catalog: the declared names.
        api: ``"trainer"`` or ``"fabric"``.
        plugin: the plugin's record (``Claim.plugin``).
        supports_compile: only those declared ``StrategyEntry(supports_compile=True)``.
    """
    return sorted(
        name
        for name, claim in catalog.claims.get("strategy", {}).items()
        if claim.plugin is plugin
        and claim.live
        and name == claim.entry.name
        and claim.entry.class_path(api)
        and (not supports_compile or getattr(claim.entry, "supports_compile", False))
    )


def strategies_of_accelerator_plugin(catalog: Catalog, api: str, accelerator: Any) -> Optional[str]:
    """A sentence naming the strategies of the plugin that supplies ``accelerator``, or ``None``.

    Appended to Lightning's refusal of a strategy for a plugin's accelerator (Lightning's
    ``_check_strategy_and_fallback``: ``strategy="fsdp"`` asks for a GPU), so that the message
    names the choices that work (the plugin's own strategy names for what Lightning's name asks).

    Args:
        catalog: the declared names.
        api: ``"trainer"`` or ``"fabric"``.
        accelerator: the run's accelerator instance.
    """
    owner = catalog.owner_of(accelerator, "accelerator", api)
    if owner is None or owner.builtin:
        return None
    names = plugin_strategy_names(catalog, api, owner.plugin)
    if not names:
        return None
    return (
        f"The accelerator {owner.entry.name!r} comes from plugin {owner.plugin.label}, whose {API_NAMES[api]}"
        f" strategies are {', '.join(map(repr, names))} (or strategy='auto')."
    )
