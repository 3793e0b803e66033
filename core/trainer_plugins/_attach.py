"""Attaching to and detaching from the imported ``lightning.Trainer`` and ``lightning.Fabric`` modules.

The start-up hook (``_trainer_plugins_autoload``) calls :func:`attach` when a Lightning package has
finished importing; :func:`trainer_plugins.install` does the same from code. This module imports
neither of them (they import it), so the start-up hook and the code API form no import circle.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

#: Where each Lightning packaging's adapter modules live: ours, and their twins built on the standalone packages.
ADAPTERS = {"lightning": "trainer_plugins", "pytorch_lightning": "trainer_plugins._standalone.trainer_plugins"}
#: Lightning's check that a strategy can run a compiled module (a function the trainer module imports).
COMPILE_CHECK = "_verify_strategy_supports_compile"
_CONNECTORS, _COMPILE = "_lightning", "_lightning_compile"
#: (packaging, Lightning module, the name it builds a connector from, (our adapter module, our replacement));
#: the trainer module's compile check is replaced the same way (a function, called like a class).
TARGETS = tuple(
    (package, module.replace("lightning.pytorch", trainer).replace("lightning.fabric", fabric), name, replacement)
    for package, trainer, fabric in (
        ("lightning", "lightning.pytorch", "lightning.fabric"),
        ("pytorch_lightning", "pytorch_lightning", "lightning_fabric"),
    )
    for module, name, replacement in (
        ("lightning.pytorch.trainer.trainer", "_AcceleratorConnector", (_CONNECTORS, "TrainerConnector")),
        ("lightning.pytorch.trainer.trainer", "_DataConnector", (_CONNECTORS, "TrainerDataConnector")),
        ("lightning.fabric.fabric", "_Connector", (_CONNECTORS, "FabricConnector")),
        ("lightning.pytorch.trainer.trainer", COMPILE_CHECK, (_COMPILE, "verify_strategy_supports_compile")),
    )
)
_originals: dict[tuple[str, str], Any] = {}


def _connector_factory(package: str, replacement: tuple[str, str]) -> Callable[..., Any]:
    """A stand-in for Lightning's connector class (or function) that calls ours, importing it on first use."""
    module, class_name = replacement

    def build_connector(*args: Any, **kwargs: Any) -> Any:
        from importlib import import_module

        return getattr(import_module(f"{ADAPTERS[package]}.{module}"), class_name)(*args, **kwargs)

    build_connector.trainer_plugins_connector = class_name  # type: ignore[attr-defined]
    return build_connector


#: The distribution of each Lightning packaging (its version decides whether we attach).
DISTRIBUTIONS = {"lightning": "lightning", "pytorch_lightning": "pytorch-lightning"}
_warned: set[str] = set()


def _lightning_version(package: str) -> str | None:
    """The installed version of Lightning ``package`` (from metadata), or ``None``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTIONS[package])
    except PackageNotFoundError:
        return None


def unsupported(package: str) -> str | None:
    """Why trainer-plugins cannot attach to the installed Lightning ``package``, or ``None`` when it can.

    The tested range is trainer-plugins' own requirement on ``lightning`` (its ``pyproject.toml``); the
    private names it relies on (``trainer_plugins._lightning_contract``) are checked in that range.
    """
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement

    installed = _lightning_version(package)
    try:
        declared = [Requirement(line) for line in requires("trainer-plugins") or []]
    except PackageNotFoundError:
        return None
    for requirement in declared:
        if requirement.name == "lightning" and installed is not None:
            if not requirement.specifier.contains(installed, prereleases=True):
                return (
                    f"trainer-plugins is tested with {DISTRIBUTIONS[package]}{requirement.specifier}, but"
                    f" {DISTRIBUTIONS[package]} {installed} is installed"
                )
    return None


def _gate_factory(package: str, original: Callable[..., Any], problem: str) -> Callable[..., Any]:
    """Lightning's own connector class, with an error that says why a plugin's name is unknown to it."""

    def build_connector(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        except ValueError as error:
            for role in ("strategy", "accelerator"):
                flag = kwargs.get(role)
                if isinstance(flag, str) and str(error).startswith(f"You selected an invalid {role} name"):
                    from trainer_plugins import get_catalog

                    claim = get_catalog().find(role, flag.lower())
                    if claim is not None and not claim.builtin:
                        raise ValueError(
                            f"{error} The {role} {flag!r} comes from plugin {claim.plugin.label}, which cannot attach"
                            f" to this Lightning version: {problem}."
                        ) from error
            raise

    build_connector.trainer_plugins_connector = None  # type: ignore[attr-defined]  # ours, but not plugin-aware
    return build_connector


def attach() -> None:
    """Point the imported Lightning Trainer/Fabric modules at the plugin-aware connectors (idempotent).

    A Lightning version outside the tested range is left alone: one ``RuntimeWarning`` says so, and
    selecting a plugin's name fails with Lightning's error plus the reason.
    """
    for package, module_name, attribute, ours in TARGETS:
        module = sys.modules.get(module_name)
        original = getattr(module, attribute, None)
        if original is None or _is_ours(original):  # not imported, still importing, or attached
            continue
        problem = unsupported(package)
        if problem is None:
            replacement = _connector_factory(package, ours)
        elif ours[1] in ("TrainerDataConnector", "verify_strategy_supports_compile"):
            continue
        else:
            replacement = _gate_factory(package, original, problem)
            if package not in _warned:
                _warned.add(package)
                import warnings

                warnings.warn(
                    f"{problem}: trainer-plugins leaves {package} alone, so no plugin is used. Install a tested"
                    " version to use the plugins.",
                    RuntimeWarning,
                    stacklevel=2,
                )
        _originals[(module_name, attribute)] = original
        setattr(module, attribute, replacement)


def detach() -> None:
    """Give the Lightning modules back their own connector classes."""
    for (module_name, attribute), original in list(_originals.items()):
        setattr(sys.modules[module_name], attribute, original)
        del _originals[(module_name, attribute)]


def attached() -> bool:
    """Whether every imported Lightning module of :data:`TARGETS` builds the plugin-aware connectors.

    ``False`` while no Lightning Trainer or Fabric module is imported.
    """
    imported = [(name, attribute) for _, name, attribute, _ in TARGETS if name in sys.modules]
    return bool(imported) and all(
        getattr(getattr(sys.modules[name], attribute, None), "trainer_plugins_connector", None) is not None
        for name, attribute in imported
    )


def _is_ours(obj: object) -> bool:
    return hasattr(obj, "trainer_plugins_connector")
