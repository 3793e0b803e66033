"""BatchNorm's running variance on XLA equals PyTorch's (issue 23, item 4).

torch_xla 2.9 updates ``running_var`` with the biased batch variance; the strategies hook every
``_BatchNorm`` of the set-up model and rescale the update (:mod:`xla_plugins.strategies._batch_norm`).
Expected values come from the same module or model on the CPU. Tolerance: float32, relative 1e-5
(measured differences were below 2e-6 relative); predictions 1e-5 absolute besides.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.xla

L = pytest.importorskip("lightning")
import torch  # noqa: E402
from torch import nn  # noqa: E402

SCRIPTS = Path(__file__).parent / "scripts"
sys.path.insert(0, str(SCRIPTS))
import batch_norm as script  # noqa: E402

RTOL, ATOL = 1e-5, 1e-5


def xla() -> torch.device:
    import torch_xla

    return torch_xla.device()


def same(a, b) -> bool:
    return torch.allclose(torch.as_tensor(a), torch.as_tensor(b), rtol=RTOL, atol=ATOL)


def batches(shape: tuple[int, ...], steps: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=generator) * (2 + i) + i for i in range(steps)]


def train(module: nn.Module, inputs: list[torch.Tensor], device) -> nn.Module:
    module = module.to(device).train()
    for x in inputs:
        module(x.to(device))
    return module.cpu()


def test_torch_xla_alone_updates_running_var_with_the_biased_variance():
    """The bug, on plain torch_xla: momentum 1 on [1, 2, 3, 4] leaves 1.25 (the CPU: 5/3); the probe sees it."""
    from xla_plugins.strategies._batch_norm import BIASED, running_var_update

    module = nn.BatchNorm1d(1, momentum=1.0).to(xla())
    module(torch.tensor([[1.0], [2.0], [3.0], [4.0]], device=xla()))
    assert module.running_var.item() == pytest.approx(1.25)
    assert running_var_update() == BIASED


CASES = [
    (nn.BatchNorm1d, (4, 1)),  # the shape: n = 4
    (nn.BatchNorm1d, (6, 3)),
    (nn.BatchNorm1d, (2, 3, 5)),  # n = batch x length
    (nn.BatchNorm2d, (2, 3, 2, 2)),
    (nn.SyncBatchNorm, (2, 3, 4)),  # without torch.distributed it computes as BatchNorm
]


@pytest.mark.parametrize(("kind", "shape"), CASES, ids=lambda v: getattr(v, "__name__", str(v)))
@pytest.mark.parametrize("momentum", [1.0, 0.1, None], ids=["momentum1", "momentum0.1", "cumulative"])
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
def test_corrected_running_stats_equal_the_cpus(kind, shape, momentum, affine):
    from xla_plugins.strategies._batch_norm import BatchNormVarianceCorrection

    inputs = batches(shape, 3)
    expected = train(kind(shape[1], momentum=momentum, affine=affine), inputs, "cpu")
    module = kind(shape[1], momentum=momentum, affine=affine)
    correction = BatchNormVarianceCorrection()
    assert correction.attach(module) == [kind.__name__]
    trained = train(module, inputs, xla())
    assert same(trained.running_var, expected.running_var), (trained.running_var, expected.running_var)
    assert same(trained.running_mean, expected.running_mean)
    assert int(trained.num_batches_tracked) == 3
    correction.detach()
    assert not module._forward_hooks and not module._forward_pre_hooks


def test_modules_without_running_stats_and_evaluation_forwards_are_left_alone():
    from xla_plugins.strategies._batch_norm import BatchNormVarianceCorrection

    untracked = nn.BatchNorm1d(3, track_running_stats=False)
    assert BatchNormVarianceCorrection().attach(nn.Sequential(untracked, nn.LayerNorm(3))) == []
    module = nn.BatchNorm1d(3)
    BatchNormVarianceCorrection().attach(module)
    module.to(xla()).eval()
    module(torch.randn(4, 3).to(xla()))
    assert module.running_var.cpu().tolist() == [1.0, 1.0, 1.0]  # evaluation: no update, no correction


@pytest.mark.parametrize("update", ["unbiased", "unknown"])
def test_no_hooks_where_torch_xla_does_not_update_with_the_biased_variance(update, monkeypatch, caplog):
    """Mocked probe answers (torch_xla 2.9 answers "biased"): PyTorch's update needs nothing; another one warns."""
    from xla_plugins.strategies import _batch_norm

    monkeypatch.setattr(_batch_norm, "running_var_update", lambda: update)
    module = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    assert _batch_norm.BatchNormVarianceCorrection().attach(module) == []
    assert not module[1]._forward_hooks
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    if update == "unbiased":
        assert warned == []
    else:
        assert len(warned) == 1 and "running_var of 1 will differ" in warned[0] and "does not correct" in warned[0]


def test_the_correction_joins_the_steps_graph_without_new_graphs_or_host_reads():
    """Steps 3 to 6 compile nothing and read nothing back, with the hooks as without them."""
    import torch_xla
    import torch_xla.debug.metrics as met

    from xla_plugins.strategies._batch_norm import BatchNormVarianceCorrection

    def count(name: str) -> int:
        data = met.metric_data(name)
        return data[0] if data else 0

    module = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3, momentum=0.2)).to(xla())
    BatchNormVarianceCorrection().attach(module)
    for step, x in enumerate(batches((8, 3), 6)):
        module(x.to(xla())).sum().backward()
        torch_xla.sync()
        if step == 1:
            before = count("CompileTime"), count("TransferFromDeviceTime")
    growth = count("CompileTime") - before[0], count("TransferFromDeviceTime") - before[1]
    assert growth == (0, 0)


def close_runs(run: dict, reference: dict) -> None:
    for key in ("running_var", "running_mean", "predicted"):
        assert same(run[key], reference[key]), (key, run[key], reference[key])
    assert run["batches"] == reference["batches"] == [4, 4]


@pytest.mark.parametrize("api", ["trainer", "fabric"])
def test_single_xla_trains_the_cpus_batch_norm_statistics_and_predictions(api):
    """single_xla: BatchNorm buffers and evaluation predictions of the trained model equal plain Lightning CPU's."""
    run = script.run(api, "xla", "auto", script.GLOBAL_BATCH)
    reference = script.run(api, "cpu", "auto", script.GLOBAL_BATCH)
    close_runs(run, reference)
    assert run["hooks_left"] == (0 if api == "trainer" else 4)  # the Trainer's teardown removes them


@pytest.fixture(scope="module")
def spmd_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("batch_norm")
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "batch_norm.py"), "--out", str(out)],
        env={**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return json.loads((out / "report.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("api", ["trainer", "fabric"])
@pytest.mark.parametrize("strategy", ["xla_spmd", "xla_fsdp_v2"])
def test_spmd_strategies_on_4_devices_train_the_cpus_batch_norm_statistics(spmd_report, api, strategy):
    """A global batch of 16 over 4 devices: the statistics are the global batch's, as on one CPU."""
    close_runs(spmd_report[f"{api}_{strategy}"], spmd_report[f"{api}_cpu"])


@pytest.mark.slow
def test_the_spawn_strategy_on_2_devices_trains_each_ranks_cpu_statistics(tmp_path):
    """``"xla"`` (with tests/xla_cpu_harness.py): each rank's BatchNorm sees its own batch, as DDP; every rank's
    statistics and predictions equal a CPU copy fed that rank's rows with the gradients averaged."""
    from xla_cpu_harness import required_environment

    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "batch_norm.py"), "--spawn", "--out", str(tmp_path)],
        env={**os.environ, **required_environment(2)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    report = json.loads((tmp_path / "report.json").read_text())
    for rank in ("0", "1"):
        close_runs(report["trainer_xla"][rank], report["trainer_cpu_replicas"][rank])
    assert report["trainer_xla"]["0"]["running_var"] != report["trainer_xla"]["1"]["running_var"]
