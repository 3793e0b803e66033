"""Listeners of Lightning's profiler actions (``trainer_plugins.add_action_listener``): one wrapper, the report kept.

In-process, on Lightning's CPU accelerator (the mechanism names no backend): the compile monitor
and the goodput ledger listen this way on XLA; tests/test_profiler.py compares their reports there.
"""

from __future__ import annotations

import gc
from types import SimpleNamespace

import lightning as L
import pytest
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.profilers import AdvancedProfiler, PassThroughProfiler, SimpleProfiler

from trainer_plugins import ActionProfiler, action_listeners, add_action_listener, remove_action_listener


class Recorder:
    """A listener that writes down what it hears, as ``(name, "enter"|"leave", action)``."""

    def __init__(self, name: str, heard: list) -> None:
        self.name, self.heard = name, heard

    def enter(self, action_name: str) -> None:
        self.heard.append((self.name, "enter", action_name))

    def leave(self, action_name: str) -> None:
        self.heard.append((self.name, "leave", action_name))


class LeavesAtTeardown(L.Callback):
    """A listener that is also a callback and stops listening in its own ``teardown`` hook, as the compile monitor does.

    Added before the run (:func:`profiled_fit`); the compile monitor is added in the accelerator's set-up.
    """

    def __init__(self) -> None:
        self.heard = 0

    def enter(self, action_name: str) -> None:
        self.heard += 1

    def leave(self, action_name: str) -> None:
        pass

    def teardown(self, trainer, pl_module, stage):
        remove_action_listener(trainer, self)
        gc.collect()  # the wrapper, dropped, is collected now (CPython frees it at once anyway)


def profiled_fit(profiler, listener, tmp_path) -> L.Trainer:
    """A short CPU fit with ``profiler``, and ``listener`` (a :class:`LeavesAtTeardown` or ``None``)."""
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=3,
        limit_val_batches=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
        profiler=profiler,
        callbacks=[] if listener is None else [listener],
    )
    if listener is not None:
        add_action_listener(trainer, listener, own_prefix=f"[Callback]{listener.state_key}.")
    trainer.fit(BoringModel())
    return trainer


def test_a_listener_leaving_before_the_end_of_the_run_leaves_the_users_advanced_profiler_report_whole(tmp_path):
    # Lightning's Profiler.__del__ tears its profiler down; a dropped wrapper tore down the profiler it wrapped,
    # before Lightning's describe() wrote the report (issue 35: 754 characters, no training_step)
    listener = LeavesAtTeardown()
    trainer = profiled_fit(AdvancedProfiler(dirpath=tmp_path, filename="report"), listener, tmp_path)
    report = (tmp_path / "fit-report.txt").read_text()
    assert "Profile stats for: [Strategy]SingleDeviceStrategy.training_step" in report
    assert "Profile stats for: run_training_batch" in report
    assert listener.heard > 0
    assert isinstance(trainer.profiler, AdvancedProfiler)  # the trainer's own profiler again


def calls_of_actions(report: str) -> dict[str, int]:
    """Each action of a SimpleProfiler report and its number of calls."""
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in report.splitlines() if "|" in line]
    return {row[0]: int(row[2]) for row in rows if len(row) > 2 and row[2].isdigit()}


def test_a_listeners_own_callback_hooks_are_not_in_the_users_report(tmp_path):
    profiled_fit(SimpleProfiler(dirpath=tmp_path, filename="on"), LeavesAtTeardown(), tmp_path)
    profiled_fit(SimpleProfiler(dirpath=tmp_path, filename="off"), None, tmp_path)
    on, off = (tmp_path / "fit-on.txt").read_text(), (tmp_path / "fit-off.txt").read_text()
    # none of its hooks, also not its teardown hook, whose stop came after the listener had left
    assert "LeavesAtTeardown" not in on
    assert calls_of_actions(on) == calls_of_actions(off)
    assert calls_of_actions(off)["[Strategy]SingleDeviceStrategy.training_step"] == 3


def test_listeners_share_one_wrapper_and_hear_in_order_the_others_leave_the_users_profiler_as_it_is():
    heard: list = []
    inner = SimpleProfiler()
    trainer = SimpleNamespace(profiler=inner)
    first, second = Recorder("first", heard), Recorder("second", heard)
    add_action_listener(trainer, first)
    add_action_listener(trainer, second, frozenset({"run_training_batch"}))
    wrapper = trainer.profiler
    assert isinstance(wrapper, ActionProfiler) and wrapper.inner is inner
    assert action_listeners(trainer) == (first, second)
    with wrapper.profile("run_training_batch"):
        with wrapper.profile("training_step"):
            pass
    assert heard == [
        ("first", "enter", "run_training_batch"),
        ("second", "enter", "run_training_batch"),
        ("first", "enter", "training_step"),
        ("first", "leave", "training_step"),
        ("second", "leave", "run_training_batch"),
        ("first", "leave", "run_training_batch"),
    ]
    assert {name: len(times) for name, times in inner.recorded_durations.items()} == {
        "run_training_batch": 1,
        "training_step": 1,
    }
    # added again: its actions replaced, still one listener
    add_action_listener(trainer, first, frozenset({"save_checkpoint"}))
    assert trainer.profiler is wrapper and action_listeners(trainer) == (second, first)
    remove_action_listener(trainer, second)
    assert trainer.profiler is wrapper
    remove_action_listener(trainer, first)
    assert trainer.profiler is inner and action_listeners(trainer) == ()
    remove_action_listener(trainer, first)  # not a listener: nothing
    assert trainer.profiler is inner


def test_one_listener_of_every_action_around_the_default_profiler_is_called_directly():
    heard: list = []
    trainer = SimpleNamespace(profiler=PassThroughProfiler())
    listener = Recorder("only", heard)
    add_action_listener(trainer, listener)
    assert trainer.profiler.start == listener.enter and trainer.profiler.stop == listener.leave
    add_action_listener(trainer, Recorder("other", heard), frozenset({"x"}))
    assert trainer.profiler.start != listener.enter
    with trainer.profiler.profile("x"):
        pass
    assert heard == [("only", "enter", "x"), ("other", "enter", "x"), ("other", "leave", "x"), ("only", "leave", "x")]


def test_the_wrapper_passes_lightnings_calls_on_to_the_users_profiler(tmp_path):
    inner = SimpleProfiler(dirpath=tmp_path, filename="calls")
    trainer = SimpleNamespace(profiler=inner)
    add_action_listener(trainer, Recorder("only", []))
    trainer.profiler.setup(stage="fit", local_rank=0, log_dir=None)
    assert inner._stage == "fit"
    module = object()
    trainer.profiler._lightning_module = module
    assert inner._lightning_module is module and trainer.profiler._lightning_module is module
    assert trainer.profiler.dirpath == tmp_path  # any other attribute: the user's profiler's
    with trainer.profiler.profile("training_step"):
        pass
    assert "training_step" in trainer.profiler.summary()
    with pytest.raises(AttributeError):
        trainer.profiler.no_such_attribute  # noqa: B018


def test_a_listener_with_a_test_hears_the_actions_it_accepts_and_the_test_is_asked_once_a_name():
    heard: list = []
    asked: list = []

    def accepts(action_name: str) -> bool:
        asked.append(action_name)
        return action_name != "empty"

    trainer = SimpleNamespace(profiler=PassThroughProfiler())
    add_action_listener(trainer, Recorder("tested", heard), accepts)
    add_action_listener(trainer, Recorder("all", heard))
    for _ in range(3):
        with trainer.profiler.profile("step"), trainer.profiler.profile("empty"):
            pass
    # the wrapper works out who hears a name the first time it comes, then only calls them
    assert asked == ["step", "empty"]
    assert heard[:6] == [
        ("tested", "enter", "step"),
        ("all", "enter", "step"),
        ("all", "enter", "empty"),
        ("all", "leave", "empty"),
        ("all", "leave", "step"),
        ("tested", "leave", "step"),
    ]
    assert len(heard) == 18
    # another listener joining: the names are asked again (a test may depend on who listens)
    add_action_listener(trainer, Recorder("late", heard), frozenset({"empty"}))
    with trainer.profiler.profile("empty"):
        pass
    assert asked == ["step", "empty", "empty"]
    assert heard[-4:] == [("all", "enter", "empty"), ("late", "enter", "empty")] + [
        ("late", "leave", "empty"),
        ("all", "leave", "empty"),
    ]


def test_the_actions_of_hooks_that_do_nothing_are_told_from_those_of_hooks_with_code():
    from lightning.pytorch.strategies import SingleDeviceStrategy
    from lightning.pytorch.utilities import rank_zero_only

    from trainer_plugins import runs_empty_hook

    class Printer(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            print(outputs)

    class Decorated(L.Callback):
        @rank_zero_only
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            pass

    class Model(BoringModel):
        def on_train_batch_start(self, batch, batch_idx):
            """Documented, and empty."""

        def on_before_backward(self, loss):
            self.seen = loss

    printer, patched = Printer(), L.Callback()
    patched.on_before_zero_grad = lambda trainer, pl_module, optimizer: print(optimizer)  # on the instance
    decorated = Decorated()
    trainer = SimpleNamespace(
        callbacks=[printer, decorated, patched],
        lightning_module=Model(),
        strategy=SingleDeviceStrategy("cpu"),
        datamodule=None,
    )
    empty = [
        f"[Callback]{printer.state_key}.on_train_batch_start",  # not overridden: Callback's own, empty
        "[Callback]Callback.on_before_backward",
        "[LightningModule]Model.on_train_batch_start",  # a docstring only
        "[LightningModule]Model.on_after_backward",
        "[LightningModule]Model.on_before_batch_transfer",  # ModelHooks': `return batch`
        "[Strategy]SingleDeviceStrategy.on_train_batch_start",
    ]
    with_code = [
        f"[Callback]{printer.state_key}.on_train_batch_end",
        f"[Callback]{decorated.state_key}.on_train_batch_start",  # rank_zero_only's wrapper runs code
        "[Callback]Callback.on_before_zero_grad",  # the instance's own function
        "[LightningModule]Model.on_before_backward",
        "[LightningModule]Model.training_step",
        "[LightningModule]Model.transfer_batch_to_device",  # ModelHooks' moves the batch
        "[Strategy]SingleDeviceStrategy.batch_to_device",
        "[LightningModule]Other.on_train_batch_start",  # not the trainer's module
        "[Callback]Missing.on_train_batch_start",  # no such callback
        "[LightningDataModule]Data.on_before_batch_transfer",  # no data module
        "run_training_batch",  # the loop's own work
        "[_TrainingEpochLoop].train_dataloader_next",
    ]
    assert [name for name in empty + with_code if runs_empty_hook(trainer, name)] == empty
