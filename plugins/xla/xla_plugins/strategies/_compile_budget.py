"""The ``recompiles=`` argument of the Trainer's XLA strategies: the compile monitor's budget for one strategy."""

from __future__ import annotations

from typing import Any, Optional

from xla_plugins.recompile_budget import check_budget


class HasCompileBudget:
    """Mixin for the Trainer's XLA strategies: takes ``recompiles`` (keyword) and keeps it as :attr:`recompiles`.

    ``recompiles`` is ``"warn"``, ``"error"``, ``"off"`` or ``None`` (``XLA_PLUGINS_RECOMPILES`` decides,
    default ``"warn"``); the compile monitor (:mod:`xla_plugins.compile_monitor`) reads it at the start
    of every run, and it wins over the variable.

    Raises:
        ValueError: ``recompiles`` is another value; the message names it and the choices.
    """

    recompiles: Optional[str] = None

    def __init__(self, *args: Any, recompiles: Optional[str] = None, **kwargs: Any) -> None:
        self.recompiles = check_budget(recompiles)
        super().__init__(*args, **kwargs)
