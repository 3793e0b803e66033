"""The ``recompiles=`` argument of the Trainer's XLA strategies: the compile monitor's budget for one strategy."""

from __future__ import annotations

from typing import Any, Optional

from xla_plugins.compilation.recompile_budget import check_budget


class HasCompileBudget:
    """Mixin for the Trainer's XLA strategies: takes ``recompiles`` (keyword) and keeps it as :attr:`recompiles`.

    ``recompiles`` is ``"warn"``, ``"error"``, ``"off"`` or ``None`` (``XLA_PLUGINS_RECOMPILES`` decides,
    default ``"warn"``); the compile monitor (:mod:`xla_plugins.compilation.compile_monitor`) reads it at the start
    of every run, and it wins over the variable.

    Raises:
        ValueError: ``recompiles`` is another value; the message names it and the choices.
    """

    recompiles: Optional[str] = None

    def __init__(self, *args: Any, recompiles: Optional[str] = None, **kwargs: Any) -> None:
        self.recompiles = check_budget(recompiles)
        super().__init__(*args, **kwargs)


class MonitorsFabricSteps(HasCompileBudget):
    """Mixin for Fabric's XLA strategies: ``recompiles=`` as above, and the compile monitor of Fabric's steps.

    The monitor (:mod:`xla_plugins.compilation.fabric_steps`) is installed when the first module is set up
    (``fabric.setup`` / ``fabric.setup_module``; Fabric calls no strategy hook earlier on one device)
    and is then :attr:`compile_monitor` (``None`` with the budget ``off``).

    Raises:
        ValueError: ``recompiles`` or ``XLA_PLUGINS_RECOMPILES`` is not a budget (the first at construction,
            the second when the first module is set up).
    """

    compile_monitor: Optional[Any] = None

    def setup_module(self, module: Any) -> Any:
        from xla_plugins.compilation import fabric_steps

        fabric_steps.install(self)
        return super().setup_module(module)  # type: ignore[misc]
