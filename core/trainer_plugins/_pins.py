"""The pins (``TRAINER_PLUGINS_PIN_*``): the name ``"auto"`` means for a role; whether a pinned environment applies.

A pin replaces the connector's choice for ``"auto"``; it never makes a run use an object that does
not fit it, so a pinned name must be registered, and a pinned cluster environment must apply.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from trainer_plugins._catalog import Catalog
from trainer_plugins._controls import PIN_VARIABLES
from trainer_plugins._explanation import describe
from trainer_plugins._guard import guard


def pinned_name(catalog: Catalog, api: str, role: str, pins: Mapping[str, str]) -> Optional[str]:
    """The name ``pins`` (the controls' role -> name) pin for ``role``, or ``None``.

    Raises:
        ValueError: the pinned name is not registered; the message names the variable and lists
            the registered names.
    """
    pinned = pins.get(role)
    if pinned and pinned not in catalog.names(role, api, include_deprecated=True):
        raise ValueError(
            f"{PIN_VARIABLES[role]}={pinned!r} names no {role}; choose one of {', '.join(catalog.names(role, api))}"
        )
    return pinned or None


def pinned_environment(catalog: Catalog, api: str, package: str, pinned: str, accelerator: Any) -> Any:
    """Build the pinned cluster environment ``pinned``, refusing one that does not apply to this run.

    Lightning's rule: an environment applies when its class's ``detect()`` says the process runs
    under it; a plugin's environment also needs that plugin's accelerator.

    Args:
        catalog: the declared names.
        api: ``"trainer"`` or ``"fabric"``.
        package: the Lightning packaging of the run.
        pinned: the pinned environment name (a registered one: :func:`pinned_name`).
        accelerator: the run's Lightning ``Accelerator``.

    Raises:
        ValueError: the pinned environment does not apply; the message names the variable, the
            environment and why.
    """
    claim = catalog.claims["environment"][pinned]
    cls = claim.load(api, package)
    variable = f"{PIN_VARIABLES['environment']}={pinned!r}"
    detected = guard(claim.plugin, f"{cls.__qualname__}.detect()", cls.detect)
    accelerator_owner = catalog.owner_of(accelerator, "accelerator", api)
    if not detected:
        why = f"{cls.__qualname__}.detect() is False: this process does not run under it"
    elif not claim.builtin and (accelerator_owner is None or accelerator_owner.plugin is not claim.plugin):
        why = (
            f"it belongs to plugin {claim.plugin.label}, and the accelerator {describe(accelerator)}"
            " is not that plugin's"
        )
    else:
        return claim.build(api, package)
    raise ValueError(
        f"{variable} does not apply to this run: {why}. Unset {PIN_VARIABLES['environment']} or run"
        " under that environment."
    )
