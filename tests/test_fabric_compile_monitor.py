"""The compile monitor in a Fabric loop (compilation.fabric_steps): late compilations and host reads inside a
training step (from the module's forward to optimizer.step()) reported once per cause with the user's line;
the budget; the summary.

Each loop runs tests/scripts/fabric_compile_monitor.py in a fresh interpreter on real torch_xla (PJRT CPU):
3 epochs of 8 steps, per-device batches of 1, and two evaluation batches under torch.no_grad() per epoch.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.xla

SCRIPT = Path(__file__).parent / "scripts" / "fabric_compile_monitor.py"
MONITOR = "XLA compile monitor:"


def loop(trigger: str, *args: str, devices: int = 1, **env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if k != "XLA_PLUGINS_RECOMPILES"}
    environ.update({"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": str(devices), **env})
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--trigger", trigger, *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    outcome = json.loads(result.stdout.splitlines()[-1])
    outcome["stderr"] = result.stderr
    return outcome


def the_one_report(outcome: dict) -> str:
    assert outcome["error"] is None, outcome["error"]
    assert len(outcome["reports"]) == 1, outcome["reports"]
    assert outcome["warnings"] == outcome["reports"]
    return outcome["reports"][0]


@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
def test_item_between_forward_and_optimizer_step_gives_one_report_naming_the_line():
    outcome = loop("item")
    report = the_one_report(outcome)
    assert report.startswith(f"{MONITOR} host read in the training step (call 3, after the warm-up of 2).")
    assert f"{SCRIPT}:" in report and "loss.item() > 100" in report
    assert "why:    a host read (`.item()`)" in report
    summary = outcome["summary"]
    assert summary["stage"] == "fabric" and summary["steps"] == 24
    assert summary["host_reads_in_steps"] == 24  # one a step, all counted; reported once
    assert "XLA compile monitor (fabric): " in outcome["stderr"]  # printed once, by finish()
    assert outcome["stderr"].count("XLA compile monitor (fabric): ") == 1  # not again at exit
    # the one line first; its table because a cause was reported
    assert "xla-plugins: Fabric loop of 24 training steps (optimizer.step() calls); " in outcome["stderr"]


@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
def test_reads_in_an_evaluation_loop_under_no_grad_are_counted_not_reported():
    outcome = loop("eval-item")
    assert outcome["error"] is None and outcome["reports"] == [] and outcome["warnings"] == []
    assert outcome["summary"]["host_reads"] == 3 * 2  # two evaluation batches read per epoch
    assert outcome["summary"]["host_reads_in_steps"] == 0


@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_a_clean_loop_gives_no_report():
    outcome = loop("none")
    assert outcome["error"] is None and outcome["reports"] == []
    assert outcome["summary"]["late_compilations"] == 0 and outcome["summary"]["steps"] == 24
    ours = [line for line in outcome["stderr"].splitlines() if line.startswith(("xla-plugins: ", "XLA compile"))]
    assert len(ours) == 1 and ours[0].startswith("xla-plugins: Fabric loop of 24 training steps"), ours


@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_longer_batches_after_the_warm_up_give_one_report_of_new_shapes_naming_the_forward_call():
    report = the_one_report(loop("padding"))
    assert report.startswith(
        f"{MONITOR} late compilation in the training step (its graph ran at optimizer.step) (call 9, after the"
    )
    assert "model(fabric.to_device(batch))" in report
    assert "why:    new input shapes (1x7) not seen before in this loop" in report  # not the evaluation's 1x5


@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_a_branch_on_the_step_number_gives_one_report_of_a_different_graph():
    report = the_one_report(loop("branch"))
    assert "(call 13, after the warm-up of 2)" in report
    assert "why:    a graph that differs from the previous one, with input shapes seen before" in report


@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_error_raises_at_the_first_late_event_with_the_report():
    outcome = loop("item", "--recompiles", "error")
    assert outcome["error"]["type"] == "LateCompilationError"
    assert outcome["error"]["step"] == 2  # the third step, the first after the warm-up
    assert outcome["error"]["message"].startswith(f"{MONITOR} host read in the training step")


@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_off_installs_nothing():
    outcome = loop("item", XLA_PLUGINS_RECOMPILES="off")
    assert outcome["reports"] is None and outcome["summary"] is None
    assert outcome["item_is_torchs"] is True
    assert MONITOR not in outcome["stderr"]


@pytest.mark.slow  # 4 devices: primary tox cell only (tox.ini)
@pytest.mark.parametrize("trigger", ["item", "branch"])
def test_the_report_text_is_the_same_on_single_xla_xla_spmd_and_xla_fsdp_v2(trigger):
    reports = {  # the compile seconds are measured, so they differ: everything else is the same text
        strategy: re.sub(
            r"\d+\.\d\d s compiling",
            "N s compiling",
            the_one_report(loop(trigger, "--strategy", strategy, devices=1 if strategy == "single_xla" else 4)),
        )
        for strategy in ("single_xla", "xla_spmd", "xla_fsdp_v2")
    }
    assert reports["xla_spmd"] == reports["single_xla"]
    assert reports["xla_fsdp_v2"] == reports["single_xla"]


@pytest.mark.slow  # 2 replica threads through tests/xla_cpu_harness.py: primary tox cell only (tox.ini)
def test_each_replica_of_the_spawn_strategy_gives_one_report_and_global_rank_0_prints_the_summary(tmp_path):
    """``strategy="xla"``: every replica runs the loop with ``.item()`` in its steps and watches its own reads.

    The replicas are threads of one process here, so what each caught with ``warnings.catch_warnings``
    (process-wide state, not thread-safe) is not compared; the monitors' own reports are.
    """
    from xla_cpu_harness import required_environment

    process = loop("item", "--strategy", "xla", "--out", str(tmp_path), devices=2, **required_environment(2))
    replicas = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [replica["rank"] for replica in replicas] == [0, 1]
    assert {key: process[key] for key in replicas[0]} == replicas[0]  # fabric.launch returned rank 0's outcome
    for replica in replicas:
        assert replica["error"] is None, replica["error"]
        (report,) = replica["reports"]
        assert report.startswith(f"{MONITOR} host read in the training step (call 3, after the warm-up of 2).")
        assert f"{SCRIPT}:" in report and "loss.item() > 100" in report
        assert replica["summary"]["steps"] == 24 and replica["summary"]["host_reads_in_steps"] == 24
    assert process["stderr"].count("XLA compile monitor (fabric): ") == 1  # global rank 0's summary, once
