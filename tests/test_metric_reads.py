"""A default Lightning script on XLA: no host read per step, no compilation after the first epoch.

Each case fits tests/scripts/default_fit.py (Trainer defaults: progress bar, logger,
``ModelCheckpoint``, model summary; validation every epoch; ``self.log(..., prog_bar=True)`` on every
step) in a fresh interpreter, and checks torch_xla's own counters (compilations, device-to-host
transfers), not times. ``XLA_PLUGINS_METRIC_READ_INTERVAL`` is set to an hour, so the on-step
progress-bar reads of the read policy (:mod:`xla_plugins.loop.metrics`) happen only for a name that has no
value yet: the counts do not depend on how fast the machine is.
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

SCRIPT = Path(__file__).parent / "scripts" / "default_fit.py"
BATCHES = 16  # training batches an epoch (default_fit.TRAIN_BATCHES)
LOG_EVERY_N_STEPS = 50  # Lightning's default
#: Device-to-host transfers an epoch allowed by the read policy, whatever the number of steps:
#: the epoch-end progress-bar reads of the training and the validation results (one transfer
#: each), the logger's epoch-end calls for training and validation (one each), the checkpoint
#: (up to two: the strategy's sync and the write), plus one logger read every log_every_n_steps.
PER_EPOCH = 2 + 2 + 2 + math.ceil(BATCHES / LOG_EVERY_N_STEPS)
#: The first epoch also reads each on-step progress-bar name once, when it first appears, and the
#: sanity check's validation results; the end of fit moves the model and the results to the CPU.
FIRST_EPOCH_EXTRA, END_OF_FIT_EXTRA = 3, 12


def fit(tmp_path: Path, strategy: str, *flags: str, devices: int = 1) -> dict:
    environ = {**os.environ, "PJRT_DEVICE": "CPU", "XLA_PLUGINS_METRIC_READ_INTERVAL": "3600"}
    if devices > 1:
        from xla_cpu_harness import required_environment  # imports torch_xla: only once the test runs

        environ.update(required_environment(devices))
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--strategy", strategy, "--root", str(tmp_path), *flags],
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.splitlines()[-1])


def check_counts(report: dict) -> None:
    epochs = report["epochs"]
    assert len(epochs) == 3
    assert [epoch["compiles"] for epoch in epochs[1:]] == [0, 0], epochs
    assert epochs[0]["transfers"] <= PER_EPOCH + FIRST_EPOCH_EXTRA, epochs
    assert epochs[1]["transfers"] <= PER_EPOCH, epochs
    assert epochs[2]["transfers"] <= PER_EPOCH + END_OF_FIT_EXTRA, epochs
    # Lightning alone reads the progress-bar value at least once a step
    assert epochs[1]["transfers"] < BATCHES


def check_exact(shown: dict, exact: dict) -> None:
    for name, value in exact.items():
        assert shown[name] == pytest.approx(value, rel=1e-5), name


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
@pytest.mark.parametrize(
    ("strategy", "devices"),
    [("single_xla", 1), pytest.param("xla_spmd", 2, marks=pytest.mark.slow)],
    ids=["single_xla", "xla_spmd-2-devices"],
)
def test_default_fit_compiles_nothing_after_the_first_epoch_and_reads_at_the_policys_cadence(
    tmp_path, strategy, devices
):
    report = fit(tmp_path, strategy, devices=devices)
    check_counts(report)
    # Lightning's default bar, redrawn by the clock; Lightning's default logger
    assert report["progress_bar_type"] == "XLAProgressBar" and report["loggers"] == ["CSVLogger"]
    # epoch-end values are exact: the last epoch's are what the progress bar shows at the end
    check_exact(report["progress_bar_metrics"], report["exact"][-1])
    assert any(tmp_path.rglob("*.ckpt")), "the default ModelCheckpoint wrote no checkpoint"


@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
def test_users_own_progress_bar_and_logger_get_every_value_at_epoch_end_with_clipping_and_accumulation(tmp_path):
    report = fit(tmp_path, "single_xla", "--own-callbacks", "--clip-accumulate")
    check_counts(report)
    assert report["progress_bar_type"] == "OwnProgressBar" and report["loggers"] == ["OwnLogger"]
    assert len(report["own_progress_bar"]) == 3
    for shown, exact in zip(report["own_progress_bar"], report["exact"], strict=True):
        check_exact(shown, exact)
    logged: dict[int, dict[str, float]] = {}
    for _, metrics in report["own_logger"]:
        logged.setdefault(int(metrics["epoch"]), {}).update(metrics)
    assert sorted(logged) == [0, 1, 2]
    for epoch, exact in enumerate(report["exact"]):
        check_exact(logged[epoch], {name: exact[name] for name in ("train_loss_epoch", "val_loss")})


def transfers() -> int:
    import torch_xla.debug.metrics as met

    data = met.metric_data("TransferFromDeviceTime")
    return int(data[0]) if data else 0


def test_fetch_reads_every_pending_tensor_in_one_transfer():
    import torch
    import torch_xla

    from xla_plugins.loop.metrics import fetch

    device = torch_xla.device()
    values = {"a": torch.tensor(1.5, device=device) * 2, "b": [torch.tensor([1, 2], device=device) + 1], "c": 3}
    torch_xla.sync()
    before = transfers()
    read = fetch(values)
    assert transfers() - before == 1
    assert read["a"].device.type == "cpu" and read["a"].item() == 3.0
    assert read["b"][0].tolist() == [2, 3] and read["c"] == 3


def logged_results(device):
    """A training result collection made lazy as `metrics.install` does, with three names logged twice."""
    import torch
    from lightning.pytorch.trainer.connectors.logger_connector.result import _ResultCollection

    from xla_plugins.loop import metrics

    results = _ResultCollection(training=True)
    results.__class__ = metrics._LazyResultCollection
    results._start()
    for value in (1.0, 3.0):
        results.log("training_step", "loss", torch.tensor(value, device=device), on_step=True, on_epoch=True)
        results.log("training_step", "peak", torch.tensor(value, device=device), on_epoch=True, reduce_fx="max")
        results.log("training_step", "total", torch.tensor(value, device=device), on_epoch=True, reduce_fx="sum")
    return results


def lightnings_walk(result) -> list:
    """Every tensor Lightning's ``_ResultMetric.to`` moves (its own collection walk over the attributes)."""
    from lightning_utilities import apply_to_collection
    from torch import Tensor

    found: list = []
    apply_to_collection(dict(vars(result)), Tensor, lambda tensor: found.append(tensor) or tensor)
    return found


def test_the_in_place_check_sees_every_tensor_lightnings_move_would_move():
    import torch

    for result in logged_results(torch.device("cpu")).values():
        for _ in ("logged", "computed"):
            moved = lightnings_walk(result)
            assert moved and sorted(map(id, result._tensors())) == sorted(map(id, moved)), result.meta.name
            result.compute()  # the epoch value is one more tensor


def test_a_logged_result_is_walked_only_when_one_of_its_tensors_is_elsewhere(monkeypatch):
    import torch
    import torch_xla
    from lightning.pytorch.trainer.connectors.logger_connector import result as lightning_result

    from xla_plugins.loop import metrics

    device = torch_xla.device()
    results = logged_results(device)
    assert {type(result) for result in results.values()} == {metrics._ResultMetricInPlace}
    loss = results["training_step.loss"]
    assert {tensor.device for tensor in lightnings_walk(loss)} == {device}
    walks = []
    monkeypatch.setattr(lightning_result, "apply_to_collection", lambda *a, **k: walks.append(a) or {})
    assert loss.to(device) is loss and walks == []  # everything is there already: no walk
    monkeypatch.undo()
    loss.to(torch.device("cpu"))  # something is elsewhere: Lightning's move
    assert {tensor.device.type for tensor in lightnings_walk(loss)} == {"cpu"}
    loss.to(device)
    assert {tensor.device for tensor in lightnings_walk(loss)} == {device}
    computed = {name: result.compute().item() for name, result in results.items()}
    assert computed == {"training_step.loss": 2.0, "training_step.peak": 3.0, "training_step.total": 4.0}


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("XLA_PLUGINS_METRIC_READS", "sometimes"),
        ("XLA_PLUGINS_METRIC_READ_INTERVAL", "-1"),
        ("XLA_PLUGINS_METRIC_READ_INTERVAL", "nan"),
    ],
)
def test_invalid_read_settings_name_the_value_and_the_choices(monkeypatch, variable, value):
    from xla_plugins.loop import metrics

    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=f"{variable}={value!r}"):
        metrics.install(object())


def test_eager_policy_leaves_lightnings_reads_alone(monkeypatch):
    import lightning as L
    from lightning.pytorch.trainer.connectors.logger_connector.logger_connector import _LoggerConnector

    from xla_plugins.loop import metrics

    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_checkpointing=False)
    monkeypatch.setenv("XLA_PLUGINS_METRIC_READS", "eager")
    assert metrics.install(trainer) is False
    assert type(trainer._logger_connector) is _LoggerConnector
    monkeypatch.setenv("XLA_PLUGINS_METRIC_READS", "lazy")
    assert metrics.install(trainer) is True
    assert isinstance(trainer.fit_loop.epoch_loop._results, metrics._LazyResultCollection)


def test_default_progress_bar_redraws_by_the_clock_and_a_chosen_one_is_left_alone(monkeypatch):
    import lightning as L
    from lightning.pytorch.callbacks import TQDMProgressBar

    from xla_plugins.loop import progress

    default = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False)
    bar = default.progress_bar_callback
    assert progress.install(default) is True
    assert default.progress_bar_callback is bar and type(bar) is progress.XLAProgressBar
    chosen = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, callbacks=[TQDMProgressBar(5)])
    assert progress.install(chosen) is False and type(chosen.progress_bar_callback) is TQDMProgressBar
    monkeypatch.setenv("XLA_PLUGINS_METRIC_READS", "eager")
    eager = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False)
    assert progress.install(eager) is False and type(eager.progress_bar_callback) is TQDMProgressBar


def test_xla_progress_bar_redraws_at_most_once_an_interval_and_at_the_last_batch():
    from xla_plugins.loop.progress import XLAProgressBar

    bar = XLAProgressBar(interval_s=3600)
    assert [bar._should_update(n, 10) for n in range(1, 11)] == [True] + [False] * 8 + [True]
    with pytest.raises(ValueError, match="-1"):
        XLAProgressBar(interval_s=-1)
