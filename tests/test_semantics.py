"""The XLA strategies behave as Lightning users expect: batch meaning, reductions, seeds, Fabric set-up.

Each strategy runs tests/scripts/semantics.py once, in a fresh interpreter under a timeout, on
PJRT CPU: ``single_xla`` on one device, ``xla`` (with tests/xla_cpu_harness.py) and ``xla_spmd``
on four. The expected values are what one device and DDP give for the same script.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.xla

SCRIPT = Path(__file__).parent / "scripts" / "semantics.py"
DEVICES = {"single_xla": 1, "xla": 4, "xla_spmd": 4}
#: The strategies as test parameters; the multi-device ones run in the primary tox cell only (tox.ini).
STRATEGIES = [pytest.param(name, marks=pytest.mark.slow) if DEVICES[name] > 1 else name for name in DEVICES]
SIZE, BATCH = 62, 4  # as in the script
_reports: dict[str, tuple[dict, str]] = {}


def report(strategy: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    """The script's report for ``strategy`` and its output (one run per strategy and session)."""
    if strategy not in _reports:
        from xla_cpu_harness import required_environment

        devices = DEVICES[strategy]
        out = tmp_path_factory.mktemp(strategy)
        result = subprocess.run(
            [sys.executable, str(SCRIPT), "--strategy", strategy, "--devices", str(devices), "--out", str(out)],
            env={**os.environ, **required_environment(devices)},
            capture_output=True,
            text=True,
            timeout=420,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
        (line,) = [line for line in result.stdout.splitlines() if line.startswith("REPORT ")]
        _reports[strategy] = json.loads(line[len("REPORT ") :]), result.stdout + result.stderr
    return _reports[strategy]


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_sync_dist_logs_every_reduction_lightning_supports(strategy, tmp_path_factory):
    """Values 0..15 in two validation batches of 8: one device and DDP log mean 7.5, sum 120, max 15, min 0."""
    logged = report(strategy, tmp_path_factory)[0]["logged"]
    assert logged == {"mean": 7.5, "sum": 120.0, "max": 15.0, "min": 0.0}


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_strategy_reduce_and_all_gather_give_what_ddp_gives(strategy, tmp_path_factory):
    """Each replica reduces and gathers its global rank: over 4 replicas mean 1.5, sum 6, max 3, min 0.

    One process (single_xla, xla_spmd) holds global tensors: its rank 0 comes back as it is.
    """
    found = report(strategy, tmp_path_factory)[0]
    if strategy == "xla":
        expected = {"reduced": {"mean": 1.5, "sum": 6.0, "max": 3.0, "min": 0.0}, "gathered": [0.0, 1.0, 2.0, 3.0]}
        ranks = range(4)
    else:
        expected = {"reduced": {"mean": 0.0, "sum": 0.0, "max": 0.0, "min": 0.0}, "gathered": [0.0]}
        ranks = range(1)
    assert found["collectives"] == {str(rank): {"kind": "collectives", **expected} for rank in ranks}
    assert found["fabric"]["reduced"] == expected["reduced"]  # fabric.all_reduce, rank 0's answer


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("api", ["trainer", "fabric"])
def test_seed_everything_governs_dropout_on_the_device(strategy, api, tmp_path_factory):
    """The same initial weights, trained with dropout: same seed, same weights; another seed, other weights.

    Runs follow each other in one process, so without seeding the device RNG would go on, and the
    same seed would give other weights.
    """
    found = report(strategy, tmp_path_factory)[0]
    seeds = found["seeds"] if api == "trainer" else found["fabric"]["seeds"]
    assert seeds["1"] == seeds["1 again"]
    assert seeds["1"] != seeds["2"]


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_fabric_set_up_path_trains_or_fails_loudly(strategy, tmp_path_factory):
    paths = {
        path: result
        for path, result in report(strategy, tmp_path_factory)[0]["fabric"].items()
        if path not in ("seeds", "reduced")
    }
    assert paths["setup"] == "trains"
    if strategy == "xla":  # Lightning's own refusal: its multi-device XLA strategy sets up jointly only
        refusal = (
            "RuntimeError: The `FabricXLAStrategy` requires the model and optimizer(s) to be set up jointly"
            " through `.setup(model, optimizer, ...)`."
        )
        assert paths == {
            "setup": "trains",
            "setup_module_then_setup_optimizers": refusal,
            "optimizer_after_setup_module": refusal,
        }
    else:
        assert paths == {
            "setup": "trains",
            "setup_module_then_setup_optimizers": "trains",
            "optimizer_after_setup_module": "trains",
        }


@pytest.mark.slow  # several devices: primary tox cell only (tox.ini)
def test_xla_and_xla_spmd_take_the_same_steps_per_epoch_on_the_same_loader(tmp_path_factory):
    """62 samples, batch_size 4, 4 devices: ceil(62 / (4 x 4)) = 4 steps, per-device batch 4, global 16."""
    spawn = report("xla", tmp_path_factory)[0]["steps"]
    spmd = report("xla_spmd", tmp_path_factory)[0]["steps"]
    expected = math.ceil(SIZE / (BATCH * 4))
    assert spawn == {str(rank): expected for rank in range(4)}
    assert spmd == {"0": expected}
    assert report("single_xla", tmp_path_factory)[0]["steps"] == {"0": math.ceil(SIZE / BATCH)}


@pytest.mark.slow  # several devices: primary tox cell only (tox.ini)
def test_spmd_start_up_log_states_the_per_device_and_the_global_batch_of_each_named_loader(tmp_path_factory):
    output = report("xla_spmd", tmp_path_factory)[1]
    lines = [line for line in output.splitlines() if line.startswith("trainer-plugins: xla_spmd: ")]
    train = "trainer-plugins: xla_spmd: train_dataloader: per-device batch 4, global batch 16 (4 x 4 devices)"
    assert any(train in line for line in lines)
    # the prediction loader (rebuilt by Lightning around its batch sampler) is worded the same way
    predict = "trainer-plugins: xla_spmd: predict_dataloader: per-device batch 4, global batch 16 (4 x 4 devices)"
    assert any(predict in line for line in lines)
    assert all(line.count("_dataloader: ") == 1 for line in lines)


def without_padding(rows: list[list[int]], size: int) -> list[int]:
    """A step's samples, device by device, less XLA's padding of the last uneven shard."""
    return [index for row in rows for index in row][:size]


@pytest.mark.slow  # several devices: primary tox cell only (tox.ini)
def test_spmd_keeps_the_order_of_an_unshuffled_loader_and_gives_device_i_the_i_th_batch(tmp_path_factory):
    order = report("xla_spmd", tmp_path_factory)[0]["order"]
    assert len(order) == 4
    for step, rows in enumerate(order[:-1]):
        assert rows == [list(range(16 * step + 4 * d, 16 * step + 4 * d + 4)) for d in range(4)]
    assert order[-1][:3] == [[48, 49, 50, 51], [52, 53, 54, 55], [56, 57, 58, 59]]
    assert order[-1][3][:2] == [60, 61]  # the epoch's remainder: 14 samples, the last shard padded by XLA


@pytest.mark.slow  # several devices: primary tox cell only (tox.ini)
def test_spmd_trains_with_a_plain_sampler_of_index_lists_as_batch_sampler(tmp_path_factory):
    """Buckets of 3 and 5 indices (16 of them): 4 buckets per step, every sample once, in order."""
    bucketed = report("xla_spmd", tmp_path_factory)[0]["bucketed"]
    assert bucketed["batches"] == 16 and len(bucketed["steps"]) == 4
    seen = [index for rows in bucketed["steps"][:-1] for index in without_padding(rows, 16)]
    seen += without_padding(bucketed["steps"][-1], SIZE - len(seen))
    assert seen == list(range(SIZE))


@pytest.mark.slow  # several devices: primary tox cell only (tox.ini)
def test_spmd_prediction_writers_get_the_indices_of_each_global_batch(tmp_path_factory):
    """A shuffled loader of 62 samples, batch_size 4: each step's batch_indices are the samples it predicted."""
    steps = report("xla_spmd", tmp_path_factory)[0]["predicted"]
    assert [len(indices) for indices, _ in steps] == [16, 16, 16, 14]
    assert all(indices == predicted for indices, predicted in steps)
    assert sorted(i for indices, _ in steps for i in indices) == list(range(SIZE))


@pytest.mark.slow  # several devices: primary tox cell only (tox.ini)
def test_spmd_batch_global_gives_torch_xlas_meaning(tmp_path_factory):
    """XLASPMDStrategy(batch="global"): each loader batch is the global batch, so ceil(62 / 4) = 16 steps."""
    assert report("xla_spmd", tmp_path_factory)[0]["global_steps"] == math.ceil(SIZE / BATCH)


@pytest.mark.slow  # several devices: primary tox cell only (tox.ini)
def test_spmd_runs_lightnings_batch_size_finder(tmp_path_factory):
    """Power scaling from 2, two trials: the same choice as on CPU (Lightning 2.5: 8, 2.6: 4), set as batch_size."""
    finder = report("xla_spmd", tmp_path_factory)[0]["finder"]
    assert finder["xla"] == finder["cpu"]
    assert finder["xla"]["model"] == finder["xla"]["optimal"] > 2
