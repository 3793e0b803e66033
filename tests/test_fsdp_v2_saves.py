"""Repeated full checkpoints of ``xla_fsdp_v2`` compile nothing new (issue 23, item 5).

torch_xla's transfer of a sharded tensor to the CPU compiles a new replicating program on every
call, so each full save of a 4-tensor model with Adam compiled 12 programs, at every save. The
strategies gather each sharded tensor through a graph of its own that torch_xla's cache serves
again (:func:`xla_plugins.strategies._parameter_sharding.gather_full`). Run on 4 PJRT CPU devices
(tests/scripts/fsdp_v2_saves.py), the Trainer and Fabric in one interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.xla, pytest.mark.slow]

SCRIPT = Path(__file__).parent / "scripts" / "fsdp_v2_saves.py"


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    found: dict[str, dict] = {}

    def get(state_dict_type: str) -> dict:
        if state_dict_type not in found:
            out = tmp_path_factory.mktemp(state_dict_type)
            result = subprocess.run(
                [sys.executable, str(SCRIPT), "--out", str(out), "--format", state_dict_type],
                env={**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"},
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
            found[state_dict_type] = json.loads((out / "report.json").read_text())
        return found[state_dict_type]

    return get


@pytest.mark.parametrize("api", ["trainer", "fabric"])
def test_a_repeated_full_save_compiles_nothing_new_and_holds_the_models_values(reports, api):
    report = reports("full")[api]
    assert report["compiled"][1:] == [0, 0]
    assert report["model_equal"] and report["optimizer_equal"]
    prefix = "net." if api == "trainer" else ""
    assert report["shapes"][f"{prefix}0.weight"] == [16, 8]  # full tensors, not a device's shard
    assert report["shapes"][f"{prefix}1.weight"] == [4, 16]


def test_the_first_full_save_compiles_at_most_one_program_per_distinct_shape(reports):
    """Four shapes (two weights, two biases; Adam's moments share them): at most 4, where it was 12 a save."""
    assert reports("full")["trainer"]["compiled"][0] <= 4


@pytest.mark.parametrize("api", ["trainer", "fabric"])
def test_a_repeated_sharded_save_compiles_nothing_either(reports, api):
    assert reports("sharded")[api]["compiled"] == [0, 0, 0]


def test_a_fit_saving_top_k_and_last_every_epoch_settles(reports):
    """ModelCheckpoint(save_top_k=2, save_last=True), 5 epochs: from epoch 3 on, an epoch compiles nothing
    (it compiled 24 programs every epoch before, 12 a save)."""
    assert reports("full")["per_epoch"][2:] == [0, 0, 0]


@pytest.mark.parametrize("state_dict_type", ["full", "sharded"])
def test_the_teardown_moves_the_sharded_state_to_the_cpu_compiling_at_most_one_program_per_shape(
    reports, state_dict_type
):
    """Lightning's move (module.cpu(), the optimizers' state) compiled a program per tensor at every teardown:
    16 here (four parameters and their Adam state). Through the gather graphs: at most one per distinct
    shape, and none where the full saves compiled them already."""
    report = reports(state_dict_type)["trainer"]
    assert report["teardown_compiled"] <= (0 if state_dict_type == "full" else 4)
    assert report["on_the_cpu_after_fit"] and report["equal_after_fit"]
