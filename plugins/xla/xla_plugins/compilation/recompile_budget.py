"""The compile monitor's budget: what a late compilation or host read does (``XLA_PLUGINS_RECOMPILES``).

``XLA_PLUGINS_RECOMPILES`` (or a Trainer XLA strategy's ``recompiles=`` argument, which wins):
``warn`` (default) warns once per cause with :class:`LateCompilationWarning`; ``error`` raises
:class:`LateCompilationError` at the first late event, with the report; ``off`` installs nothing.
The monitor itself is :mod:`xla_plugins.compilation.compile_monitor`.
"""

from __future__ import annotations

import os
from typing import Optional

#: Variable that sets the budget: ``warn`` (default), ``error`` or ``off``.
BUDGET_VARIABLE = "XLA_PLUGINS_RECOMPILES"
BUDGETS = ("warn", "error", "off")


class LateCompilationWarning(UserWarning):
    """A compilation or host read after the warm-up (``XLA_PLUGINS_RECOMPILES=warn``)."""


class LateCompilationError(RuntimeError):
    """A compilation or host read after the warm-up with ``XLA_PLUGINS_RECOMPILES=error``; the message is the report."""


def check_budget(value: Optional[str], source: str = "recompiles") -> Optional[str]:
    """``value`` as a budget name (``"warn"``, ``"error"``, ``"off"``; case and blanks ignored), ``None`` if ``None``.

    Args:
        value: the budget, or ``None`` (not set).
        source: how the value was given, for the error (``"recompiles"``, the variable's name).

    Raises:
        ValueError: any other value; the message names it and the choices.
    """
    if value is None:
        return None
    budget = str(value).strip().lower()
    if budget not in BUDGETS:
        raise ValueError(f"{source}={value!r} is not a compile budget; choose one of {', '.join(BUDGETS)}.")
    return budget


def budget(strategy_value: Optional[str] = None) -> str:
    """The budget: the strategy's ``recompiles=`` if given, else ``XLA_PLUGINS_RECOMPILES``, else ``"warn"``.

    Raises:
        ValueError: either value is not one of :data:`BUDGETS` (the message names it and the choices).
    """
    from_strategy = check_budget(strategy_value)
    text = os.environ.get(BUDGET_VARIABLE, "")
    from_environment = check_budget(text, BUDGET_VARIABLE) if text.strip() else None
    return from_strategy or from_environment or "warn"


__all__ = ["BUDGETS", "BUDGET_VARIABLE", "LateCompilationError", "LateCompilationWarning", "budget", "check_budget"]
