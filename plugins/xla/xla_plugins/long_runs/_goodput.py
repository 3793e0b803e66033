"""The goodput ledger on the Trainer's XLA strategies: the core's ledger of each ``fit``, fed torch_xla's compile time.

The ledger itself (its buckets, the record in the run directory, the table, the logger values) is
the core's (``trainer_plugins._goodput``); :class:`KeepsGoodputLedger` keeps one for each ``fit`` of
the Trainer's XLA strategies, on global rank 0, and gives it
:class:`~xla_plugins.compilation.loop_phases.CompileSeconds` (torch_xla's ``CompileTime`` metric) as its compile
reader. ``XLA_PLUGINS_GOODPUT=off`` keeps none.
"""

from __future__ import annotations

from typing import Any, Optional

from lightning.pytorch.trainer.states import TrainerFn

from trainer_plugins import GoodputLedger, _variables, start_ledger
from xla_plugins import end_of_run
from xla_plugins.compilation.loop_phases import CompileSeconds

#: Variable that switches the goodput ledger ``on`` (default) or ``off``.
GOODPUT_VARIABLE = "XLA_PLUGINS_GOODPUT"
GOODPUT_CHOICES = ("on", "off")


def goodput_switch() -> str:
    """``"on"`` (default, also when empty) or ``"off"``, from :data:`GOODPUT_VARIABLE` (case and blanks ignored).

    Raises:
        ValueError: any other value; the message names the variable, the value and the choices.
    """
    return _variables.choice_from_environment(GOODPUT_VARIABLE, GOODPUT_CHOICES, "on")


class KeepsGoodputLedger:
    """Mixin for the Trainer's XLA strategies (the first of their bases): the goodput ledger of every ``fit``.

    * ``setup_environment``: after the strategy's own, on global rank 0 of a ``fit``, the ledger starts
      (:func:`trainer_plugins._goodput.start_ledger`; its start-up counts from the start of the process that
      called ``fit``, for the spawn strategy the launcher's main process) and hears the trainer's profiler
      actions from then on (the strategies' own ``setup`` methods differ; ``setup_environment`` is the hook
      all of them pass on);
    * ``on_exception``: the ledger learns why the fit ends, and the strategies' own ``on_exception``
      (the stop checkpoint, :mod:`xla_plugins.long_runs._preemption`) counts as checkpoint save;
    * ``teardown``: after the strategy's own, the ledger's last account and record; its figures go into the
      run's one line at the end (:mod:`xla_plugins.end_of_run`).

    The spawn strategy's replicas run no ``on_exception`` or ``teardown`` when a stop signal ends them:
    their record ends with the stop checkpoint's save.

    Raises:
        ValueError: ``XLA_PLUGINS_GOODPUT`` is not ``on`` or ``off`` (from ``setup_environment``).
    """

    lightning_module: Any
    _goodput: Optional[GoodputLedger] = None

    def setup_environment(self) -> None:
        switch = goodput_switch()
        super().setup_environment()  # type: ignore[misc]
        self._goodput = None
        module = self.lightning_module
        trainer = getattr(module, "_trainer", None) if module is not None else None
        if switch == "off" or trainer is None or trainer.state.fn != TrainerFn.FITTING or not trainer.is_global_zero:
            return
        main_process = getattr(getattr(self, "_launcher", None), "_main_pid", None)
        self._goodput = start_ledger(trainer, CompileSeconds(), main_process)
        self._goodput.watch()

    def on_exception(self, exception: BaseException) -> None:
        ledger = self._goodput
        if ledger is None:
            super().on_exception(exception)  # type: ignore[misc]
            return
        ledger.interrupted(exception)
        with ledger.timing("checkpoint_save"):
            super().on_exception(exception)  # type: ignore[misc]

    def teardown(self) -> None:
        super().teardown()  # type: ignore[misc]
        ledger, self._goodput = self._goodput, None
        if ledger is not None:
            end_of_run.ledger_finished(ledger.trainer, ledger.finish())
