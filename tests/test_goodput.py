"""The goodput ledger of a fit on the Trainer's XLA strategies, in subprocesses on real torch_xla (PJRT CPU).

Each run is tests/scripts/goodput_fit.py in its own process: 2 epochs of 8 batches, validation
(2 batches) after each epoch and 2 sanity-check batches, a ``ModelCheckpoint``, and sleeps where
each bucket's time is spent. A sleep of s seconds takes at least s, so each bucket must hold at
least the sleeps of its place, counted by the script: lower bounds that load cannot break. The
buckets add up to the wall time by construction; the tests check that they do (to float rounding,
:data:`TOLERANCE_S`), that the wall time lies within the process's life (Unix times the script
printed), and that the compilation bucket is torch_xla's ``CompileTime`` total.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from trainer_plugins._goodput_ledger import BUCKETS, Attempt, RunLedger, goodput_summary_line, goodput_table_lines
from trainer_plugins._goodput_record import read_ledger

pytestmark = pytest.mark.xla

SCRIPT = Path(__file__).parent / "scripts" / "goodput_fit.py"
EPOCHS, BATCHES, VAL_BATCHES, SANITY_BATCHES = 2, 8, 2, 2
STEPS = EPOCHS * BATCHES
#: Buckets add up to the wall time to float rounding (a few hundred additions of seconds).
TOLERANCE_S = 1e-6
#: Time resolution of the process start (Linux /proc, clock ticks of 10 ms) plus the clock reads around it.
START_RESOLUTION_S = 0.02
SLEEPS = {"FETCH_SLEEP": "0.02", "STEP_SLEEP": "0.03", "VAL_SLEEP": "0.05", "SAVE_SLEEP": "0.1", "SETUP_SLEEP": "0.5"}


def run_fit(root: Path, strategy: str = "single_xla", devices: int = 1, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("XLA_PLUGINS_")}
    environ.update({"PJRT_DEVICE": "CPU", "STRATEGY": strategy, "DEVICES": str(devices), **env})
    if devices > 1:
        environ["CPU_NUM_DEVICES"] = str(devices)
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(root)], env=environ, capture_output=True, text=True, timeout=300
    )


def output(result: subprocess.CompletedProcess) -> str:
    return result.stdout + result.stderr


def report(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, output(result)
    return json.loads(result.stdout.strip().splitlines()[-1])


def counts(root: Path) -> list[dict]:
    """The counts each process of the run left (ordered by the time they were written)."""
    return [json.loads(p.read_text()) for p in sorted(root.glob("counts-*.json"), key=os.path.getmtime)]


def logged(root: Path) -> list[dict]:
    """The ``log_metrics`` calls with the ledger's values, in order."""
    lines = (root / "logged.jsonl").read_text().splitlines()
    return [entry for entry in map(json.loads, lines) if "goodput" in entry["metrics"]]


def assert_adds_up(ledger: RunLedger) -> None:
    for attempt in ledger.attempts:
        assert set(attempt.seconds) == set(BUCKETS)
        assert all(seconds >= 0 for seconds in attempt.seconds.values()), attempt
        assert attempt.wall_s > 0
    totals = ledger.totals()
    assert abs(sum(v for k, v in totals.items() if k != "wall") - totals["wall"]) < TOLERANCE_S
    assert totals["wall"] == pytest.approx(sum(a.wall_s for a in ledger.attempts), abs=TOLERANCE_S)
    assert ledger.goodput() == pytest.approx(totals["productive"] / totals["wall"])


@pytest.fixture(scope="module")
def sleepy_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One uninterrupted fit on single_xla with every sleep and a checkpoint every 3 steps (plus the epoch ends)."""
    root = tmp_path_factory.mktemp("goodput") / "run"
    return root, run_fit(root, EVERY_N="3", **SLEEPS)


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
def test_the_buckets_add_up_to_the_wall_time_and_each_holds_the_sleeps_of_its_place(sleepy_run):
    root, result = sleepy_run
    printed = report(result)
    ledger = read_ledger(root)
    assert_adds_up(ledger)
    [attempt] = ledger.attempts
    [calls] = counts(root)
    assert (attempt.first_step, attempt.last_step, attempt.ended) == (0, STEPS, "finished")
    assert ledger.steps == STEPS == printed["global_step"] and ledger.lost_steps == 0
    assert calls["step"] == calls["fetch"] == STEPS
    assert calls["val"] == SANITY_BATCHES + EPOCHS * VAL_BATCHES
    assert calls["save"] >= STEPS // 3  # every 3 steps and at the epochs' ends (last.ckpt too)
    seconds = attempt.seconds
    assert seconds["data"] >= calls["fetch"] * float(SLEEPS["FETCH_SLEEP"])
    assert seconds["productive"] >= calls["step"] * float(SLEEPS["STEP_SLEEP"])
    assert seconds["validation"] >= calls["val"] * float(SLEEPS["VAL_SLEEP"])
    assert seconds["checkpoint_save"] >= calls["save"] * float(SLEEPS["SAVE_SLEEP"])
    assert seconds["startup"] >= float(SLEEPS["SETUP_SLEEP"])
    # compilation is torch_xla's CompileTime total (nothing compiles in this process outside the ledger's span)
    assert seconds["compilation"] == pytest.approx(printed["compile_s"], abs=1e-6)
    assert seconds["compilation"] > 0
    # the wall time starts with the process (before its first line) and ends inside fit
    assert attempt.started_at <= printed["first_line"] + START_RESOLUTION_S
    assert printed["before_fit"] <= attempt.started_at + attempt.wall_s <= printed["after_fit"] + START_RESOLUTION_S


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
def test_the_logger_receives_the_run_figures_at_each_epoch_end(sleepy_run):
    root, _ = sleepy_run
    ledger = read_ledger(root)
    entries = logged(root)
    assert [entry["step"] for entry in entries] == [BATCHES * (epoch + 1) for epoch in range(EPOCHS)]
    keys = {"goodput", "goodput/wall_s", "goodput/steps", "goodput/lost_steps", "goodput/attempts"}
    keys |= {f"goodput/{name}_s" for name in (*BUCKETS, "lost")} | {"epoch"}
    for epoch, entry in enumerate(entries):
        values = entry["metrics"]
        assert set(values) == keys and values["epoch"] == epoch  # as Lightning's own rows
        assert values["goodput/steps"] == BATCHES * (epoch + 1) and values["goodput/attempts"] == 1
        assert abs(sum(values[f"goodput/{name}_s"] for name in (*BUCKETS, "lost")) - values["goodput/wall_s"]) < 1e-6
        assert values["goodput"] == pytest.approx(values["goodput/productive_s"] / values["goodput/wall_s"])
    assert entries[0]["metrics"]["goodput/wall_s"] < entries[1]["metrics"]["goodput/wall_s"] <= ledger.totals()["wall"]


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
def test_a_clean_fit_prints_one_line_of_ours_with_the_records_goodput_and_lightnings_step(sleepy_run):
    # before: a 10-line goodput table and a 7-line compile summary after every fit
    root, result = sleepy_run
    ledger = read_ledger(root)
    ours = [
        line for line in output(result).splitlines() if line.startswith(("xla-plugins: ", "XLA compile", "Goodput "))
    ]
    assert len(ours) == 1, output(result)
    assert ours[0].startswith(f"xla-plugins: fit ended at trainer.global_step={report(result)['global_step']}; ")
    assert ours[0].endswith(f"; {goodput_summary_line(ledger)} (XLA_PLUGINS_SUMMARY=tables for details)")
    assert not any(line.startswith("  ") and " s " in line for line in output(result).splitlines())  # no table


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
def test_the_cli_prints_the_ledger_of_a_run_directory_as_text_and_json(sleepy_run):
    root, _ = sleepy_run
    ledger = read_ledger(root)
    command = [str(Path(sys.executable).parent / "trainer-plugins"), "goodput"]
    text = subprocess.run([*command, str(root)], capture_output=True, text=True, timeout=60)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == f"{root}: run {ledger.run}"
    assert lines[1].startswith(f"Goodput {ledger.goodput():.1%} over ")
    assert lines[-2:] == ["attempts:", f"  1: steps 0-16, {ledger.attempts[0].wall_s:.1f} s, finished"]
    as_json = subprocess.run([*command, "--json", str(root / "goodput")], capture_output=True, text=True, timeout=60)
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert data["directory"] == str(root / "goodput")
    assert RunLedger.from_dict(data) == ledger
    assert data["totals"] == pytest.approx(ledger.totals()) and data["steps"] == STEPS


@pytest.mark.slow  # CI budget: primary tox cell only (tox.ini)
def test_lost_work_after_a_sigkill_equals_the_steps_redone(tmp_path):
    root, kill_at = tmp_path / "run", 7  # killed in the training step of global step 7; checkpoints every 3 steps
    killed = run_fit(root, EVERY_N="3", KILL_AT=str(kill_at), STEP_SLEEP="0.03")
    assert killed.returncode == -9, output(killed)
    assert read_ledger(root).current.last_step == kill_at  # the stamp of the last step before the kill
    resumed = run_fit(root, EVERY_N="3", CKPT_PATH="last", STEP_SLEEP="0.03")
    printed = report(resumed)
    start = int(next(line for line in resumed.stdout.splitlines() if line.startswith("START_GLOBAL_STEP")).split()[1])
    assert start in (3, 6)  # the newest complete checkpoint (the one of step 6 may still have been in its write)
    ledger = read_ledger(root)
    assert_adds_up(ledger)
    first, second = ledger.attempts
    assert (first.first_step, first.last_step, first.ended) == (0, kill_at, None)
    assert (second.first_step, second.last_step, second.ended) == (start, STEPS, "finished")
    assert first.lost_steps == kill_at - start == ledger.lost_steps  # the steps trained again
    assert ledger.steps == STEPS == printed["global_step"]  # every step counted once
    assert counts(root)[0]["step"] == kill_at  # the killed process's training steps before the kill
    assert first.lost_s >= first.lost_steps * 0.03  # the redone steps' productive time, their sleeps included
    assert first.lost_s <= first.seconds["productive"]
    assert ledger.totals()["lost"] == first.lost_s


@pytest.mark.slow  # CI budget: primary tox cell only (tox.ini)
def test_the_ledger_adds_up_across_a_sigterm_stop_and_the_resume(tmp_path):
    root = tmp_path / "run"
    stopped = run_fit(root, STOP_AT="3", SAVE_SLEEP="0.3")  # the stop checkpoint after step 4
    assert stopped.returncode == 143, output(stopped)
    after_stop = read_ledger(root)
    [first] = after_stop.attempts
    assert (first.last_step, first.ended) == (4, "interrupted (SIGTERMException)")
    assert first.seconds["checkpoint_save"] >= 0.3  # the stop checkpoint's save
    assert sum(line.startswith("Goodput ") for line in output(stopped).splitlines()) == 1
    resumed = run_fit(root, CKPT_PATH="last", LOAD_SLEEP="0.4")
    assert report(resumed)["global_step"] == STEPS
    ledger = read_ledger(root)
    assert_adds_up(ledger)
    assert ledger.run == after_stop.run
    again, second = ledger.attempts
    assert again.seconds == first.seconds and again.last_step == first.last_step  # the first attempt as recorded
    assert again.lost_steps == 0 and again.lost_s == 0.0  # the stop checkpoint holds every step trained
    assert (second.number, second.first_step, second.last_step, second.ended) == (2, 4, STEPS, "finished")
    assert second.resumed_from == str(root / "checkpoints" / "last-stopped.ckpt")
    assert second.seconds["checkpoint_restore"] >= 0.4
    assert ledger.steps == STEPS and ledger.totals()["wall"] == pytest.approx(first.wall_s + second.wall_s)
    # what the resumed run logged at its epoch ends already counts the first attempt
    entries = logged(root)
    assert entries[-1]["metrics"]["goodput/attempts"] == 2 and entries[-1]["metrics"]["goodput/wall_s"] > first.wall_s


@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
def test_xla_plugins_goodput_off_keeps_no_ledger(tmp_path):
    root = tmp_path / "run"
    result = run_fit(root, XLA_PLUGINS_GOODPUT="off")
    assert report(result)["global_step"] == STEPS
    assert not (root / "goodput").exists()
    assert "Goodput " not in output(result)
    assert not (root / "logged.jsonl").exists() or not logged(root)


def test_a_bad_goodput_setting_names_the_value_and_the_choices(monkeypatch):
    from xla_plugins.long_runs._goodput import GOODPUT_VARIABLE, goodput_switch

    monkeypatch.setenv(GOODPUT_VARIABLE, "sometimes")
    with pytest.raises(ValueError, match="XLA_PLUGINS_GOODPUT='sometimes' is not valid: give one of on, off"):
        goodput_switch()
    for text, value in (("", "on"), (" OFF ", "off"), ("on", "on")):
        monkeypatch.setenv(GOODPUT_VARIABLE, text)
        assert goodput_switch() == value


@pytest.mark.slow  # several devices: primary tox cell only (tox.ini)
@pytest.mark.parametrize(("strategy", "devices"), [("xla_spmd", 4), ("xla_fsdp_v2", 4), ("xla", 2)])
def test_every_xla_strategy_keeps_a_ledger_that_adds_up(tmp_path, strategy, devices):
    root, env = tmp_path / "run", {"STEP_SLEEP": "0.03", "VAL_SLEEP": "0.05"}
    if strategy == "xla":  # replica threads of one worker through the test harness (docs/testing.md)
        from xla_cpu_harness import required_environment

        env.update(required_environment(devices), HARNESS=str(Path(__file__).parent))
    result = run_fit(root, strategy=strategy, devices=devices, **env)
    report(result)
    ledger = read_ledger(root)
    assert_adds_up(ledger)
    [attempt] = ledger.attempts
    [calls] = counts(root)  # rank 0's steps and validation batches (it alone keeps the ledger)
    assert (attempt.last_step, attempt.ended, calls["step"]) == (STEPS, "finished", STEPS)
    seconds, slept = attempt.seconds, {"productive": calls["step"] * 0.03, "validation": calls["val"] * 0.05}
    assert calls["val"] > 0 and seconds["compilation"] > 0
    if strategy == "xla":  # replica threads: torch_xla's compile seconds are the process's (every replica's
        # compilations, capped at each interval's length), so rank 0's intervals may lose time to the others'
        assert seconds["productive"] + seconds["validation"] + seconds["compilation"] >= sum(slept.values())
    else:
        assert seconds["productive"] >= slept["productive"] and seconds["validation"] >= slept["validation"]
    assert [entry["step"] for entry in logged(root)] == [BATCHES, STEPS]
    # one line, rank 0's (a spawn worker's log lines may come twice, through a root handler too, with prefixes)
    lines = {line[line.index("xla-plugins: ") :] for line in output(result).splitlines() if "xla-plugins: fit " in line}
    assert len(lines) == 1 and f"; {goodput_summary_line(ledger)} (" in lines.pop(), output(result)[-3000:]
    assert " wall time: " not in output(result)  # no table


class _Trainer:
    """What a GoodputLedger reads of a Trainer, for the in-process test below (no device, no loop)."""

    def __init__(self, root: Path) -> None:
        self.global_step, self.default_root_dir, self.loggers, self.checkpoint_callbacks = 4, str(root), [], []


def test_the_stop_checkpoint_written_from_on_exception_counts_as_checkpoint_save(tmp_path):
    import time

    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from trainer_plugins._goodput import start_ledger
    from xla_plugins.long_runs._goodput import KeepsGoodputLedger

    class Saving:  # the strategy's own on_exception: the stop checkpoint's save and wait (_preemption)
        def on_exception(self, exception):
            time.sleep(0.2)

        def teardown(self):
            pass

    class Strategy(KeepsGoodputLedger, Saving):
        pass

    strategy = Strategy()
    strategy._goodput = ledger = start_ledger(_Trainer(tmp_path))
    with pytest.raises(ValueError, match="'lunch' is not a bucket of an interval: choose one of data, validation,"):
        with ledger.timing("lunch"):
            pass
    strategy.on_exception(SIGTERMException())
    strategy.teardown()
    attempt = ledger.ledger.current
    assert attempt.seconds["checkpoint_save"] >= 0.2
    assert attempt.ended == "interrupted (SIGTERMException)"
    assert strategy._goodput is None


def a_ledger(ended: Optional[str] = "finished") -> RunLedger:
    seconds = dict.fromkeys(BUCKETS, 1.0)
    return RunLedger("run", [Attempt(1, 0, 16, seconds, ended=ended)])


def test_the_end_of_a_fit_prints_the_tables_on_request_or_when_an_attempt_was_interrupted(monkeypatch):
    from xla_plugins.end_of_run import SUMMARY_VARIABLE, end_lines

    done = "fit ended at trainer.global_step=16"
    monkeypatch.delenv(SUMMARY_VARIABLE, raising=False)
    ledger = a_ledger()
    assert goodput_summary_line(ledger) == "goodput 12.5% of 8.0 s"
    line = f"xla-plugins: {done}; goodput 12.5% of 8.0 s"
    assert end_lines("fit", done, None, ledger) == [f"{line} ({SUMMARY_VARIABLE}=tables for details)"]
    monkeypatch.setenv(SUMMARY_VARIABLE, " Tables ")
    assert end_lines("fit", done, None, ledger) == [line, *goodput_table_lines(ledger)]
    monkeypatch.setenv(SUMMARY_VARIABLE, "line")
    interrupted = a_ledger("interrupted (SIGTERMException)")
    assert end_lines("fit", done, None, interrupted) == [line, *goodput_table_lines(interrupted)]
    # an attempt known from a checkpoint's snapshot only (a fit resumed in another directory) is not interrupted
    assert end_lines("fit", done, None, a_ledger(None)) == [f"{line} ({SUMMARY_VARIABLE}=tables for details)"]
    monkeypatch.setenv(SUMMARY_VARIABLE, "off")
    assert end_lines("fit", done, None, interrupted) == []
    monkeypatch.setenv(SUMMARY_VARIABLE, "loud")
    with pytest.raises(ValueError, match=r"^XLA_PLUGINS_SUMMARY='loud' is not valid: give one of line, tables, off\.$"):
        end_lines("fit", done, None, ledger)
