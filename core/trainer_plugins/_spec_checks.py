"""Checks against the hook specification: a plugin's declared API, the core's arguments, a hook's answer.

Each check returns what is wrong as text ('' or ``None`` when all is well) or raises for the core's
own bug; what follows from a problem (quarantine, an error for the user) is the guard's and the
manager's business.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Optional

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from trainer_plugins import _hookspecs
from trainer_plugins._entries import APIS, ENTRY_TYPES, ROLE_BASES
from trainer_plugins._standalone import package_of, resolve_in

#: The availability probe: its failures make a plugin not available for one run, never quarantine it.
PROBE_HOOK = "trainer_plugins_accelerator_available"
#: Hooks that listing and ``doctor`` call; what a plugin prints in them is captured like at import.
QUIET_HOOKS = frozenset({*_hookspecs.DECLARATION_HOOKS.values(), "trainer_plugins_doctor"})
#: Hooks whose answer is ``True``, ``False`` or ``None``.
BOOLEAN_HOOKS = frozenset({PROBE_HOOK, "trainer_plugins_accept_lightning_refusal"})
#: Hooks whose answer is a name (a non-empty ``str``) or ``None``.
NAME_HOOKS = frozenset({"trainer_plugins_strategy_for_name"})
_ROLE_OF_DECLARATION = {hook: role for role, hook in _hookspecs.DECLARATION_HOOKS.items()}
#: Decision hook -> (role whose Lightning base class the answer must be an instance of, names allowed).
_DECISION_KINDS = {
    "trainer_plugins_select_strategy": ("strategy", True),
    "trainer_plugins_select_precision": ("precision", False),
    "trainer_plugins_select_environment": ("environment", False),
}


def api_problem(declared: Optional[str]) -> Optional[str]:
    """Why a plugin declaring ``TRAINER_PLUGINS_API = declared`` cannot be loaded, or ``None``."""
    version = _hookspecs.HOOKSPEC_VERSION
    if declared is None:
        return f"declares no TRAINER_PLUGINS_API; this trainer-plugins implements hookspec API {version}"
    try:
        supported = SpecifierSet(declared)
    except (InvalidSpecifier, TypeError):
        return f"TRAINER_PLUGINS_API={declared!r} is not a version specifier such as '>=1.0,<2'"
    if not supported.contains(version):
        return f"supports hookspec API {declared}, but this trainer-plugins implements {version}"
    return None


def wrapper_problem(options: Mapping[str, Mapping[str, Any]]) -> Optional[str]:
    """Why hook implementations with these hookimpl ``options`` (attribute -> options) cannot be used, or ``None``.

    Hook wrappers would see the guard's :class:`~trainer_plugins._records.Answer` objects instead of
    the plugins' answers, so they are refused.
    """
    wrappers = [name for name, opts in options.items() if opts.get("hookwrapper") or opts.get("wrapper")]
    return f"hook wrappers are not supported ({', '.join(sorted(wrappers))})" if wrappers else None


#: Hook argument -> (check, what it must be), for :func:`check_arguments`.
_ARGUMENT_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "api": (lambda value: value in APIS, f"one of {APIS}"),
    "error": (lambda value: isinstance(value, BaseException), "an exception"),
    "name": (lambda value: isinstance(value, str), "a str"),
    "num_nodes": (lambda value: isinstance(value, int) and value >= 1, "an int >= 1"),
    "parallel_devices": (lambda value: isinstance(value, list), "a list"),
    "precision": (lambda value: isinstance(value, str), "a str"),
    "processes_per_node": (lambda value: isinstance(value, int) and value >= 1, "an int >= 1"),
    "started_externally": (lambda value: isinstance(value, bool), "a bool"),
}
#: The pre-start environment hook: its answer maps variable names to values, all strings.
LAUNCH_ENVIRONMENT_HOOK = "trainer_plugins_launch_environment"


def check_arguments(hook_name: str, kwargs: Mapping[str, Any]) -> None:
    """Refuse a call whose arguments break the hook specification, so no plugin is blamed for the core's bug.

    Raises:
        TypeError: an argument breaks its rule; the message names the hook, the argument and the rule.
    """
    for argument, value in kwargs.items():
        rule = _ARGUMENT_RULES.get(argument)
        if rule is not None and not rule[0](value):
            raise TypeError(f"trainer-plugins called {hook_name} with {argument}={value!r}; it must be {rule[1]}")


def _kind(value: Any) -> str:
    if isinstance(value, type):
        return f"the class {value.__module__}.{value.__qualname__} (not an instance)"
    if isinstance(value, str):
        return f"the string {value!r}"
    return f"a {type(value).__module__}.{type(value).__qualname__}"


def wrong_kind(hook_name: str, result: Any, api: Any) -> str:
    """What is wrong with ``result`` as an answer of ``hook_name`` ('' when it is fine).

    Args:
        hook_name: a hook of :mod:`trainer_plugins._hookspecs`.
        result: what the implementation returned.
        api: the call's ``api`` argument (decision hooks), which decides the Lightning base class.
    """
    if result is None:
        return ""
    if hook_name in _ROLE_OF_DECLARATION:
        expected = ENTRY_TYPES[_ROLE_OF_DECLARATION[hook_name]]
        if not isinstance(result, (list, tuple)):
            return f"{_kind(result)}; expected a list of {expected.__name__}"
        wrong = [entry for entry in result if not isinstance(entry, expected)]
        return f"a list holding {_kind(wrong[0])}; expected a list of {expected.__name__}" if wrong else ""
    if hook_name in BOOLEAN_HOOKS:
        return "" if isinstance(result, bool) else f"{_kind(result)}; expected True, False or None"
    if hook_name == LAUNCH_ENVIRONMENT_HOOK:
        if not isinstance(result, Mapping):
            return f"{_kind(result)}; expected a dict of str to str or None"
        wrong = [(k, v) for k, v in result.items() if not (isinstance(k, str) and k and isinstance(v, str))]
        return f"a dict holding {wrong[0]!r}; expected non-empty str names and str values" if wrong else ""
    if hook_name in NAME_HOOKS:
        return "" if isinstance(result, str) and result else f"{_kind(result)}; expected a registered name or None"
    if hook_name == "trainer_plugins_doctor":
        return "" if isinstance(result, Mapping) else f"{_kind(result)}; expected a dict or None"
    if hook_name in _DECISION_KINDS and api in APIS:
        role, names_allowed = _DECISION_KINDS[hook_name]
        base = resolve_in(ROLE_BASES[(role, api)], package_of(result))  # lightning's or pytorch_lightning's
        if isinstance(result, base) or (names_allowed and isinstance(result, str) and result):
            return ""
        wanted = f"a {base.__module__}.{base.__qualname__} instance" + (
            " or a registered name" if names_allowed else ""
        )
        return f"{_kind(result)}; expected {wanted}"
    return ""
