"""The compile monitor (xla_plugins.compilation.compile_monitor): late compilations and host reads reported once per
cause, naming the hook and the user's line; the budget; the summary equal to torch_xla's own counters.

Each fit runs tests/scripts/compile_monitor_fit.py (or, for a clean default script,
tests/scripts/default_fit.py) in a fresh interpreter: torch_xla keeps compiled graphs for the life
of a process, so a graph compiled by an earlier fit in the same process would not compile again.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.xla

SCRIPTS = Path(__file__).parent / "scripts"
FIT = SCRIPTS / "compile_monitor_fit.py"
MONITOR = "XLA compile monitor:"


def run(script: Path, *args: str, devices: int = 1, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PJRT_DEVICE": "CPU", **env}
    environ.pop("XLA_PLUGINS_RECOMPILES", None) if "XLA_PLUGINS_RECOMPILES" not in env else None
    if devices > 1:
        from xla_cpu_harness import required_environment  # imports torch_xla: only once the test runs

        environ.update(required_environment(devices))
    return subprocess.run(
        [sys.executable, str(script), *args], env=environ, capture_output=True, text=True, timeout=600
    )


def fit(tmp_path: Path, trigger: str, *args: str, devices: int = 1, **env: str) -> dict:
    result = run(FIT, "--trigger", trigger, "--root", str(tmp_path), *args, devices=devices, **env)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.splitlines()[-1])


def the_one_report(outcome: dict) -> str:
    assert outcome["error"] is None, outcome["error"]
    assert len(outcome["reports"]) == 1, outcome["reports"]
    assert outcome["warnings"] == outcome["reports"]
    return outcome["reports"][0]


@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_padding_each_batch_to_its_longest_sequence_gives_one_report_of_new_shapes(tmp_path):
    report = the_one_report(fit(tmp_path, "padding"))
    assert report.startswith(f"{MONITOR} late compilation in training_step (its graph ran at optimizer_step)")
    assert f"{FIT}:" in report and "(Model.training_step)" in report
    assert "why:    new input shapes (1x7) not seen before in this loop" in report
    assert "pad every batch to a fixed length" in report and "drop_last=True" in report
    assert "1 compilation(s)" in report


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
def test_item_in_training_step_gives_one_report_naming_the_line(tmp_path):
    outcome = fit(tmp_path, "item")
    report = the_one_report(outcome)
    assert report.startswith(f"{MONITOR} host read in training_step (call 3, after the warm-up of 2)")
    # the warning is located at the user's line (before: at the plugin's own `warnings.warn` call)
    line = next(n for n, text in enumerate(FIT.read_text().splitlines(), 1) if text.strip() == "if loss.item() > 100:")
    assert outcome["warning_locations"] == [f"{FIT}:{line}"]
    assert f"{FIT}:" in report and "`if loss.item() > 100:`" in report
    assert "why:    a host read (`.item()`)" in report
    assert "keep the value on the device" in report


@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_print_in_a_callbacks_on_train_batch_end_gives_one_report_naming_the_callback(tmp_path):
    report = the_one_report(fit(tmp_path, "callback-print"))
    assert report.startswith(f"{MONITOR} host read in on_train_batch_end of callback Printer (call 3,")
    assert '`print(outputs["loss"])`' in report
    assert "printing or formatting a tensor" in report


@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_a_branch_on_the_step_number_gives_one_report_of_a_different_graph(tmp_path):
    report = the_one_report(fit(tmp_path, "branch"))
    assert report.startswith(f"{MONITOR} late compilation in training_step (its graph ran at optimizer_step) (call 13,")
    assert "(Model.training_step)" in report
    assert "why:    a graph that differs from the previous one, with input shapes seen before" in report
    assert "torch.where" in report


@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_a_last_partial_validation_batch_is_one_expected_compilation_and_not_reported(tmp_path):
    # validation batches of 2 from 5 items: each validation run ends with a batch of 1 (before: a report
    # with the remedy drop_last=True, which would drop evaluation data)
    outcome = fit(tmp_path, "partial-validation")
    assert outcome["error"] is None
    assert outcome["reports"] == [] and outcome["warnings"] == []
    assert outcome["summary"]["late_compilations"] == 0


@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_a_host_read_and_new_shapes_in_one_step_are_each_reported_as_themselves(tmp_path):
    # before: the new shapes' compilation was added to the read's report, and the rest of the step's
    # graph reported as "a graph that differs ... with input shapes seen before"
    outcome = fit(tmp_path, "item-padding")
    assert outcome["error"] is None
    read, shapes = outcome["reports"]
    assert read.startswith(f"{MONITOR} host read in training_step (call 3, after the warm-up of 2)")
    assert "`if loss.item() > 100:`" in read and "0 compilation(s)" in read
    assert shapes.startswith(f"{MONITOR} late compilation in training_step (call 10, after the warm-up of 2)")
    assert "why:    new input shapes (1x7) not seen before in this loop" in shapes
    assert "(Model.training_step)" in shapes and "pad every batch" in shapes
    assert "differs from the previous one" not in "".join(outcome["reports"])
    assert outcome["warnings"] == outcome["reports"]
    # the new shapes explain both parts of the step's graph: its forward (compiled at the read), then the rest
    phases = outcome["summary"]["phases"]
    assert phases["training_step"]["late_compilations"] >= 1 and phases["optimizer_step"]["late_compilations"] >= 1


@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
def test_clean_model_gives_no_report_and_the_summary_equals_torch_xlas_counter_deltas(tmp_path):
    outcome = fit(tmp_path, "none")
    assert outcome["error"] is None
    assert outcome["reports"] == [] and outcome["warnings"] == []
    summary = outcome["summary"]
    compilations, compile_s, host_reads = outcome["delta"]
    assert compilations > 0 and host_reads > 0
    assert (summary["compilations"], summary["host_reads"]) == (compilations, host_reads)
    assert summary["compile_s"] == pytest.approx(compile_s)
    phases = summary["phases"].values()
    assert sum(p["compilations"] for p in phases) == compilations
    # reads through tensor methods are counted per phase; Lightning's and the plugin's batched reads are the rest
    batched = summary["host_reads_not_through_tensor_methods"]
    assert 0 < batched <= host_reads
    assert sum(p["host_reads"] for p in phases) + batched == host_reads
    assert summary["late_compilations"] == 0 and summary["host_reads_in_steps"] == 0
    assert summary["steps"] == 3 * 8 + 2 + 3 * 4  # training steps, sanity check, validation steps


@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_the_monitor_adds_no_compilation_and_no_host_read(tmp_path):
    # the progress-bar values are read at most every XLA_PLUGINS_METRIC_READ_INTERVAL seconds (0.5 s by
    # default), so their transfers depend on the time a step takes: on a loaded machine the two fits read
    # 29 and 30 times. An interval longer than the fit leaves the reads the policy's own: first and epoch ends
    steady = {"XLA_PLUGINS_METRIC_READ_INTERVAL": "3600"}
    watched = fit(tmp_path / "warn", "none", XLA_PLUGINS_RECOMPILES="warn", **steady)
    unwatched = fit(tmp_path / "off", "none", XLA_PLUGINS_RECOMPILES="off", **steady)
    assert watched["summary"] is not None and unwatched["summary"] is None
    # compilations and transfers are counts, the same with and without the monitor
    assert watched["delta"][0] == unwatched["delta"][0]
    assert watched["delta"][2] == unwatched["delta"][2]


@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_the_summary_is_logged_when_fit_ends(tmp_path):
    result = run(FIT, "--trigger", "item", "--root", str(tmp_path))
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads(result.stdout.splitlines()[-1])["summary"]
    output = result.stdout + result.stderr
    assert (
        f"XLA compile monitor (fit): {summary['compilations']} compilation(s), {summary['compile_s']:.2f} s compiling,"
        f" {summary['late_compilations']} late; {summary['host_reads']} host read(s)"
    ) in output
    assert "  training_step: " in output and "host read(s) in 24 call(s)" in output
    # one `.item()` a step, 3 epochs of 8 steps: 24 reads counted in training_step
    assert summary["phases"]["training_step"]["host_reads"] == 24
    assert summary["host_reads_in_steps"] == 24


@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_error_raises_at_the_first_late_event_with_the_report(tmp_path):
    outcome = fit(tmp_path, "item", XLA_PLUGINS_RECOMPILES="error")
    assert outcome["error"]["type"] == "LateCompilationError"
    assert outcome["error"]["message"] == outcome["reports"][0]
    assert "`if loss.item() > 100:`" in outcome["error"]["message"]
    assert outcome["error"]["step"] == 2  # the third training_step raised: two steps completed
    assert outcome["warnings"] == []
    assert outcome["item_is_torchs"]  # the read methods are unwrapped after the run raised


@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_the_strategy_argument_wins_over_the_variable(tmp_path):
    outcome = fit(tmp_path, "item", "--recompiles", "error", XLA_PLUGINS_RECOMPILES="warn")
    assert outcome["error"]["type"] == "LateCompilationError"


@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_off_reports_nothing(tmp_path):
    outcome = fit(tmp_path, "item", XLA_PLUGINS_RECOMPILES="off")
    assert outcome["reports"] is None and outcome["warnings"] == [] and outcome["error"] is None
    assert outcome["item_is_torchs"]


@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_a_bad_budget_is_a_value_error_naming_the_value_and_the_choices(tmp_path):
    outcome = fit(tmp_path, "none", XLA_PLUGINS_RECOMPILES="loud")
    assert outcome["error"] == {
        "type": "ValueError",
        "message": "XLA_PLUGINS_RECOMPILES='loud' is not a compile budget; choose one of warn, error, off.",
        "step": 0,
    }


def test_a_bad_strategy_argument_is_a_value_error_naming_the_value_and_the_choices():
    from xla_plugins.compilation.recompile_budget import check_budget

    with pytest.raises(
        ValueError, match=r"^recompiles='loud' is not a compile budget; choose one of warn, error, off\.$"
    ):
        check_budget("loud")
    assert check_budget(" Error ") == "error"
    assert check_budget(None) is None


@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_a_clean_default_script_with_clipping_and_accumulation_gives_no_report(tmp_path):
    result = run(SCRIPTS / "default_fit.py", "--strategy", "single_xla", "--root", str(tmp_path), "--clip-accumulate")
    assert result.returncode == 0, result.stderr[-4000:]
    assert MONITOR not in result.stderr
    assert "xla-plugins: fit ended at trainer.global_step=" in result.stdout + result.stderr  # the one line
    assert "XLA compile monitor (fit):" not in result.stdout + result.stderr  # no table: nothing to look at


@pytest.mark.slow  # 4 devices: primary tox cell only (tox.ini)
@pytest.mark.parametrize("trigger", ["item", "callback-print", "branch"])
def test_the_report_text_is_the_same_on_single_xla_xla_spmd_and_xla_fsdp_v2(tmp_path, trigger):
    reports = {  # the compile seconds are measured, so they differ: everything else is the same text
        strategy: re.sub(
            r"\d+\.\d\d s compiling",
            "N s compiling",
            the_one_report(
                fit(tmp_path / strategy, trigger, "--strategy", strategy, devices=1 if strategy == "single_xla" else 4)
            ),
        )
        for strategy in ("single_xla", "xla_spmd", "xla_fsdp_v2")
    }
    assert reports["xla_spmd"] == reports["single_xla"]
    assert reports["xla_fsdp_v2"] == reports["single_xla"]
    assert reports["single_xla"].startswith(MONITOR)


@pytest.mark.slow  # 4 devices: primary tox cell only (tox.ini)
def test_replica_threads_of_one_process_report_only_their_own_causes_and_rank_0_logs_one_summary(tmp_path):
    # the spawn strategy on PJRT CPU: one worker process, a replica thread per device; each thread's
    # monitor sees the other threads' compilations in torch_xla's counters (before the rule, two
    # "late compilation" reports of validation graphs the other threads compiled a phase apart)
    result = run(FIT, "--trigger", "item", "--strategy", "xla", "--root", str(tmp_path), devices=4)
    assert result.returncode == 0, result.stderr[-4000:]
    output = result.stdout + result.stderr
    # Python prints each warning after its file and line; the workers' warnings are printed, each text once
    reports = [line[line.index(MONITOR) :] for line in output.splitlines() if MONITOR in line]
    assert reports, output[-4000:]
    assert all(line.startswith(f"{MONITOR} host read in training_step (") for line in reports), reports
    assert "`if loss.item() > 100:`" in output
    summaries = [line for line in output.splitlines() if line.startswith(MONITOR[:-1] + " (fit): ")]
    assert len(summaries) == 1, summaries  # global rank 0's, not one a replica thread
    assert " 0 late; " in summaries[0]
    assert "  4 replica threads share this process and torch_xla's counters" in output


@pytest.mark.parametrize(("world_size", "reported"), [(1, 1), (4, 0)])
def test_stand_in_counter_a_compilation_past_the_warm_up_with_seen_shapes_is_reported_only_where_no_replica_shares_it(
    world_size, reported
):
    # torch_xla's compile counter stood in for (a thread of another replica cannot be timed to compile
    # in a given phase): it moves in the 1st validation step (its graph) and in the 4th, shapes seen before:
    # on one replica that is its own late graph; with 4 replica threads in the process perhaps another
    # thread's compilation of its own graph
    from types import SimpleNamespace

    from xla_plugins.compilation.compile_monitor import CompileMonitor
    from xla_plugins.runtime._world import RuntimeFigures
    from xla_plugins.testing import simulated_runtime

    class Module:  # the user's validation_step, which built the graph
        def validation_step(self, batch, batch_idx): ...

    trainer = SimpleNamespace(
        world_size=world_size,
        is_global_zero=True,
        lightning_module=Module(),
        callbacks=[],
        state=SimpleNamespace(stage=None),
    )
    monitor = CompileMonitor("warn")
    with simulated_runtime(lambda: RuntimeFigures(1, 0, 1, world_size, world_size)):
        monitor._start_run(trainer)
    compilations = [0]
    monitor._counter_value = lambda name: compilations[0]
    monitor._metric_data = lambda name: (1, 0.0)
    monitor._compilations = 0
    action = "[Strategy]XLAStrategy.validation_step"
    with pytest.warns() if reported else contextlib.nullcontext():
        for call in range(4):
            monitor._batch_starts()
            monitor._on_batch("validation", torch.zeros(1, 5))
            monitor.enter(action)
            compilations[0] += call in (0, 3)  # the first step's own graph, then one past the warm-up
            monitor.leave(action)
    assert len(monitor.reports) == reported
    assert monitor.phases[action].counts.compilations == 2  # counted either way
    assert monitor.replica_threads == world_size


def test_replica_threads_are_the_ranks_a_process_holds():
    from xla_plugins.compilation.compile_monitor import replica_threads
    from xla_plugins.runtime._world import RuntimeFigures
    from xla_plugins.testing import simulated_runtime

    def figures(processes: int, devices_each: int) -> RuntimeFigures:
        return RuntimeFigures(processes, 0, processes, processes * devices_each, devices_each)

    assert replica_threads(1) == 1  # single_xla, and the SPMD strategies on one host: no figures read
    with simulated_runtime(lambda: figures(1, 4)):
        assert replica_threads(4) == 4  # the spawn strategy on PJRT CPU: one process, a thread per device
    with simulated_runtime(lambda: figures(4, 2)):
        assert replica_threads(8) == 2  # TPU v3-8: a process per chip, a thread per core
    with simulated_runtime(lambda: figures(4, 1)):
        assert replica_threads(4) == 1  # a process per device (TPU v4 and later)


@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_each_of_fit_validate_test_and_predict_ends_with_a_summary_on_request_and_off_removes_the_monitor():
    from conftest import run_python

    result = run_python(
        """
        import os, torch, lightning as L
        from lightning.pytorch.demos.boring_classes import BoringModel
        from xla_plugins.compilation.compile_monitor import CompileMonitor

        class Model(BoringModel):
            def test_step(self, batch, batch_idx):
                self.log("test_loss", self.step(batch))

        model = Model()
        trainer = L.Trainer(accelerator="tpu", devices=1, max_epochs=1, limit_train_batches=4, limit_val_batches=2,
                            limit_test_batches=3, limit_predict_batches=3, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(model); trainer.validate(model); trainer.test(model); trainer.predict(model)
        os.environ["XLA_PLUGINS_RECOMPILES"] = "off"
        trainer.test(model)
        print("monitors:", len([c for c in trainer.callbacks if isinstance(c, CompileMonitor)]))
        print("item:", torch.Tensor.item.__qualname__)
        """,
        env={"PJRT_DEVICE": "CPU", "XLA_PLUGINS_RECOMPILES": None, "XLA_PLUGINS_SUMMARY": "tables"},
    )
    output = result.stdout + result.stderr
    stages = [line.split("(")[1].split(")")[0] for line in output.splitlines() if line.startswith(MONITOR[:-1] + " (")]
    assert stages == ["fit", "validate", "test", "predict"]  # the last test ran with the monitor off
    # the one line of each, in Lightning's counts (limit_*_batches), before its table
    assert "xla-plugins: fit ended at trainer.global_step=4; " in output
    for line in (
        "validate ran 2 batches (validation_step)",
        "test ran 3 batches (test_step)",
        "predict ran 3 batches (predict_step)",
    ):
        assert f"xla-plugins: {line}; " in output
    assert "monitors: 0" in output and "item: TensorBase.item" in output


def stand_in_trainer(world_size: int = 1, num_val_batches: tuple = (3,)) -> object:
    """What the monitor reads of a Trainer, for the stand-in tests that drive it by hand."""
    from types import SimpleNamespace

    return SimpleNamespace(
        world_size=world_size,
        is_global_zero=True,
        lightning_module=None,
        callbacks=[],
        state=SimpleNamespace(stage=None),
        sanity_checking=False,
        num_val_batches=list(num_val_batches),
        num_sanity_val_batches=[min(2, n) for n in num_val_batches],
    )


def stand_in_monitor(trainer: object) -> tuple:
    """A monitor of ``trainer``'s run whose compile counter is a list the test moves (``counter[0] += 1``)."""
    from xla_plugins.compilation.compile_monitor import CompileMonitor

    monitor = CompileMonitor("warn")
    monitor._start_run(trainer)
    counter = [0]
    monitor._counter_value = lambda name: counter[0]
    monitor._metric_data = lambda name: (1, 0.0)
    monitor._compilations = 0
    return monitor, counter


def validation_runs(monitor, counter, trainer, sizes: list, compile_at_end: bool) -> None:
    """Validation runs by hand: ``sizes`` are the batch sizes of each run; its graph compiles at its end."""
    action = "[Strategy]SingleDeviceXLAStrategy.validation_step"
    end = "[Strategy]SingleDeviceXLAStrategy.on_validation_end"
    for run_sizes in sizes:
        for index, size in enumerate(run_sizes):
            monitor.on_validation_batch_start(trainer, None, torch.zeros(size, 5), index)
            monitor.enter(action)
            monitor.leave(action)
        monitor.enter(end)
        counter[0] += compile_at_end
        monitor.leave(end)
        compile_at_end = False


def test_stand_in_counter_an_evaluation_loaders_smaller_last_batch_is_expected_but_not_a_smaller_middle_one():
    import warnings

    from xla_plugins.compilation.recompile_budget import LateCompilationWarning

    trainer = stand_in_trainer(num_val_batches=(3,))
    monitor, counter = stand_in_monitor(trainer)
    # the sanity check (2 full batches) then a validation run of 3 batches whose last is smaller
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        validation_runs(monitor, counter, trainer, [[2, 2], [2, 2, 1]], compile_at_end=False)
        counter[0] += 1  # the validation run's graph, with the smaller last batch, compiled at its end
        monitor.enter("[Strategy]SingleDeviceXLAStrategy.on_validation_end")
        monitor.leave("[Strategy]SingleDeviceXLAStrategy.on_validation_end")
    assert monitor.reports == []
    # a smaller batch that is not the loader's last is new shapes, reported
    trainer.num_val_batches = [4]
    with pytest.warns(LateCompilationWarning):
        validation_runs(monitor, counter, trainer, [[2, 3, 2, 1]], compile_at_end=True)
    assert len(monitor.reports) == 1 and "new input shapes (3x5) not seen before" in monitor.reports[0]


def test_stand_in_counter_each_cause_is_warned_once_per_trainer_located_at_the_users_line():
    import sys
    import warnings

    from xla_plugins.compilation.recompile_budget import LateCompilationWarning

    trainer = stand_in_trainer()
    monitor, counter = stand_in_monitor(trainer)
    action = "[Strategy]SingleDeviceXLAStrategy.training_step"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # two runs of the same trainer (fit, then fit again): the monitor is reused
            monitor._start_run(trainer)
            monitor._counter_value = lambda name: counter[0]
            for _ in range(4):
                monitor.on_train_batch_start(trainer, None, torch.zeros(1, 5), 0)
                monitor.enter(action)
                monitor._flush(read=("item", sys._getframe()))  # a host read on this line
                monitor.leave(action)
            assert len(monitor.reports) == 1  # each run's own reports
    ours = [w for w in caught if issubclass(w.category, LateCompilationWarning)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    line = next(
        n for n, text in enumerate(Path(__file__).read_text().splitlines(), 1) if "# a host read on this" in text
    )
    assert (ours[0].filename, ours[0].lineno) == (__file__, line)


def test_a_warning_located_in_the_main_module_of_python_c_is_issued(monkeypatch):
    # `python -c`'s __main__ has BuiltinImporter as its loader and no __file__: asking it for the source
    # raised ImportError ("'__main__' is not a built-in module") from the warning (tests/test_spmd_batches.py)
    import importlib.machinery
    import types
    import warnings

    from xla_plugins.compilation.host_reads import SourceLine, warn_at

    main = types.ModuleType("fake_c_main")
    main.__loader__ = importlib.machinery.BuiltinImporter
    monkeypatch.setitem(sys.modules, "fake_c_main", main)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_at("a late compilation", UserWarning, SourceLine("<string>", 7, "fake_c_main"))
    assert [(str(w.message), w.filename, w.lineno) for w in caught] == [("a late compilation", "<string>", 7)]
