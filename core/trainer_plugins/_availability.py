"""Whether an accelerator can run here, for one run: its plugin's probe hook, else its class's ``is_available()``.

Lightning asks ``Accelerator.is_available()`` to resolve ``accelerator="auto"``; a plugin may answer
more cheaply through ``trainer_plugins_accelerator_available``. Either answer is bounded by the probe
timeout (``TRAINER_PLUGINS_PROBE_TIMEOUT``), so a wedged driver cannot hang a run.
"""

from __future__ import annotations

from typing import Any

from trainer_plugins._catalog import Claim
from trainer_plugins._errors import PluginError
from trainer_plugins._guard import guard
from trainer_plugins._manager import PluginManager
from trainer_plugins._records import Run


def accelerator_available(
    manager: PluginManager, run: Run, name: str, claim: Claim, api: str, package: str, probe_timeout: float
) -> bool:
    """Whether accelerator ``name`` (claimed by ``claim``) can run here, for ``run``; asked once per run.

    A probe (or ``is_available()``) that raises, answers with a non-boolean, does not answer
    within ``probe_timeout`` seconds, or whose class cannot be imported makes its plugin not
    available for ``run`` only (reported once as a ``PluginWarning``); the next run asks again.
    Lightning's own ``is_available()`` is not bounded.

    Args:
        manager: the plugin manager to ask.
        run: the run asking; ``run.answers`` keeps each answer, ``run.unavailable`` the failures.
        name: the accelerator name asked about (the entry's name or an alias).
        claim: the catalogue's claim on ``name``.
        api: ``"trainer"`` or ``"fabric"``.
        package: the Lightning packaging of the run.
        probe_timeout: seconds a plugin's probe may take.
    """
    if name not in run.answers:
        run.answers[name] = _ask(manager, run, name, claim, api, package, probe_timeout)
    return run.answers[name]


def _ask(manager: PluginManager, run: Run, name: str, claim: Claim, api: str, package: str, timeout: float) -> bool:
    answer = manager.call_first("trainer_plugins_accelerator_available", run=run, name=name)
    if not claim.live or claim.plugin.name in run.unavailable:
        return False
    if answer is not None:
        return bool(answer[1])
    try:
        accelerator_class: Any = claim.load(api, package)
        available = guard(
            claim.plugin,
            f"{accelerator_class.__qualname__}.is_available()",
            accelerator_class.is_available,
            timeout=None if claim.builtin else timeout,
        )
    except (PluginError, ModuleNotFoundError) as fault:
        manager.not_available(claim.plugin, run, fault)
        return False
    return bool(available)
