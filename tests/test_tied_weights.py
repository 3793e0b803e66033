"""Tied weights stay tied through every move of every XLA strategy (issue 23 item 1; Lightning #2705).

A language model's output layer shares the embedding's weight (``dec.weight = emb.weight``). Moving a
module between the CPU and an XLA device replaces its ``Parameter`` objects, one per submodule, so
the tie used to come undone at teardown (Trainer) or at setup (Fabric): the model had one parameter
more and a second ``fit`` trained two separate weights. tests/scripts/tied_weights.py runs, per
strategy and in its own interpreter, two consecutive runs of one model and a resumed run from the
first run's checkpoint, with the Trainer and with Fabric, then the same runs on plain Lightning on
the CPU. ``single_xla`` uses one device; ``xla`` (spawn, with tests/xla_cpu_harness.py), ``xla_spmd``
and ``xla_fsdp_v2`` four. Weights are compared in float32 with an absolute tolerance of 1e-5
(measured differences at most 3e-7).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.xla

SCRIPTS = Path(__file__).parent / "scripts"
DEVICES = {"single_xla": 1, "xla": 4, "xla_spmd": 4, "xla_fsdp_v2": 4}
STRATEGIES = [
    "single_xla",
    pytest.param("xla", marks=pytest.mark.slow),
    pytest.param("xla_spmd", marks=pytest.mark.slow),
    pytest.param("xla_fsdp_v2", marks=pytest.mark.slow),
]
CLASSES = {
    "single_xla": ["SingleDeviceXLAStrategy", "FabricSingleDeviceXLAStrategy"],
    "xla": ["XLAStrategy", "FabricXLAStrategy"],
    "xla_spmd": ["XLASPMDStrategy", "FabricXLASPMDStrategy"],
    "xla_fsdp_v2": ["XLAFSDPv2Strategy", "FabricXLAFSDPv2Strategy"],
}
CPU_PARAMETERS = 3  # emb.weight (= dec.weight), mid.weight, mid.bias
ATOL = 1e-5


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """``strategy -> report.json`` of tests/scripts/tied_weights.py, run once per strategy on demand."""
    found: dict[str, dict] = {}

    def get(strategy: str) -> dict:
        if strategy not in found:
            from xla_cpu_harness import required_environment  # imports torch_xla: only once the test runs

            out = tmp_path_factory.mktemp(strategy)
            devices = DEVICES[strategy]
            result = subprocess.run(
                [sys.executable, str(SCRIPTS / "tied_weights.py"), "--strategy", strategy, "--devices", str(devices)]
                + ["--out", str(out)],
                env={**os.environ, **required_environment(devices)},
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
            found[strategy] = json.loads((out / "report.json").read_text())
            assert found[strategy]["strategies"] == CLASSES[strategy]
        return found[strategy]

    return get


def largest_difference(run: dict, reference: dict) -> float:
    assert run["weights"].keys() == reference["weights"].keys()
    return max(
        abs(a - b)
        for name, values in reference["weights"].items()
        for a, b in zip(run["weights"][name], values, strict=True)
    )


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
@pytest.mark.parametrize("api", ["trainer", "fabric"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_model_keeps_one_parameter_for_the_tie_after_every_run(strategy, api, reports):
    report = reports(strategy)
    assert [run["count"] for run in report["cpu"][api]] == [CPU_PARAMETERS] * len(report["cpu"][api])
    assert [(run["count"], run["tied"]) for run in report["xla"][api]] == [(CPU_PARAMETERS, True)] * len(
        report["cpu"][api]
    )


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
@pytest.mark.parametrize("api", ["trainer", "fabric"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_two_consecutive_runs_equal_the_same_runs_on_plain_lightning_on_cpu(strategy, api, reports):
    report = reports(strategy)
    first, second = report["xla"][api][:2]
    cpu_first, cpu_second = report["cpu"][api][:2]
    assert largest_difference(first, cpu_first) <= ATOL
    assert largest_difference(second, cpu_second) <= ATOL
    assert largest_difference(second, first) > 100 * ATOL  # the second run trained


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_tie_survives_resuming_from_a_checkpoint(strategy, reports):
    """``fit(ckpt_path=...)`` of a fresh model from the first run's checkpoint, as on the CPU from the same file."""
    report = reports(strategy)
    resumed, cpu_resumed = report["xla"]["trainer"][2], report["cpu"]["trainer"][2]
    assert (resumed["count"], resumed["tied"]) == (CPU_PARAMETERS, True)
    assert largest_difference(resumed, cpu_resumed) <= ATOL


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_fabric_optimizer_holds_the_tied_parameter_once_and_only_the_models_parameters(strategy, reports):
    """Fabric re-points an optimizer built on the CPU parameters (``setup_module`` then ``setup_optimizers``,
    or ``setup(model, optimizer)`` on ``xla``, which refuses the former); it must see the tie once."""
    report = reports(strategy)
    assert [(run["optimizer"], run["optimizer_on_model"]) for run in report["xla"]["fabric"]] == [
        (CPU_PARAMETERS, True)
    ] * 2


@pytest.mark.slow
def test_the_tie_survives_resuming_from_a_sharded_xla_fsdp_v2_checkpoint(reports):
    """The sharded format loads through torch.distributed.checkpoint; the resumed weights equal the CPU's
    resumed from the full checkpoint of the same first run."""
    report = reports("xla_fsdp_v2")
    assert [(run["count"], run["tied"]) for run in report["sharded"]] == [(CPU_PARAMETERS, True)] * 3
    assert largest_difference(report["sharded"][2], report["cpu"]["trainer"][2]) <= ATOL
