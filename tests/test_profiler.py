"""Lightning's profilers on XLA: XLAProfiler with manual optimization (Lightning #20206: the first `opt.step()`
failed with "Expecting scope to be empty but it is [Strategy]...training_step", on every XLA strategy), and
every profiler's report with the plugin's listeners (compile monitor, goodput ledger) on as off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_python

pytestmark = pytest.mark.xla

SCRIPTS = Path(__file__).parent / "scripts"
PROFILED_FITS = SCRIPTS / "profiled_fits.py"

SCRIPT = f"""
import json, sys, torch, lightning as L
from lightning.pytorch.profilers import XLAProfiler
sys.path.insert(0, {str(SCRIPTS)!r})
from profiled_fits import Manual, free_port  # a BoringModel with manual optimization

def fit(strategy, devices, profiled):
    L.seed_everything(0)
    model = Manual()
    trainer = L.Trainer(accelerator="tpu", devices=devices, strategy=strategy, max_steps=3, limit_val_batches=0,
                        logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                        profiler=XLAProfiler(port=free_port()) if profiled else None)
    trainer.fit(model)
    return [x for p in model.parameters() for x in p.detach().cpu().flatten().tolist()]

print(json.dumps({{f"{{s}} {{str(p).lower()}}": fit(s, d, p) for s, d in STRATEGIES for p in (True, False)}}))
"""


@pytest.mark.parametrize(
    "strategies",
    [
        pytest.param([("single_xla", 1)], id="single_xla"),
        pytest.param([("xla_spmd", 4), ("xla_fsdp_v2", 4)], id="spmd", marks=pytest.mark.slow),
    ],
)
@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
def test_xla_profiler_with_manual_optimization_trains_to_the_weights_of_the_plain_run(strategies):
    result = run_python(
        f"STRATEGIES = {strategies!r}\n" + SCRIPT, env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"}, timeout=600
    )
    runs = json.loads(result.stdout.splitlines()[-1])
    for strategy, _ in strategies:
        assert runs[f"{strategy} true"] == runs[f"{strategy} false"]


@pytest.mark.slow  # a fresh interpreter with 16 fits: primary tox cell only (tox.ini)
def test_every_lightning_profiler_reports_the_same_with_the_plugins_listeners_on_as_off():
    # Lightning's Profiler.__del__ tears its profiler down: a listener's wrapper dropped at the compile
    # monitor's teardown hook, before Lightning's describe(), emptied the AdvancedProfiler's report
    result = subprocess.run(
        [sys.executable, str(PROFILED_FITS)],
        env={**os.environ, "PJRT_DEVICE": "CPU"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    fits = json.loads(result.stdout.splitlines()[-1])
    for profiler in ("simple", "advanced", "pytorch", "xla"):
        for optimization in ("automatic", "manual"):
            on, off = fits[f"{profiler} {optimization} on"], fits[f"{profiler} {optimization} off"]
            assert (on["listeners"], off["listeners"]) == (2, 0), (profiler, optimization)  # monitor and ledger
            assert on["report"] == off["report"], (profiler, optimization)
            # a report of the fit's steps, not an empty one
            steps = [name for name in off["report"] if "training_step" in name or "validation_step" in name]
            assert steps, (profiler, optimization, off["report"])
