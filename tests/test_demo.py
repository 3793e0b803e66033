"""The demo (examples/train_digits.py, `tox -e demo`) end to end, with a small epoch count."""

from __future__ import annotations

import csv
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# The demo runs in the primary tox cell only (tox.ini): its own environment has those versions.
pytestmark = [pytest.mark.xla, pytest.mark.slow]

DEMO = Path(__file__).resolve().parents[1] / "examples" / "train_digits.py"
SUMMARY = re.compile(r"test_accuracy=(\d\.\d{4}) steps_per_s=\d+\.\d device=CPU precision=bf16-true")
EPOCHS = 2


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    environ = {key: value for key, value in os.environ.items() if key != "PJRT_DEVICE"}  # as a user runs it
    result = subprocess.run(
        [sys.executable, str(DEMO), "--epochs", str(EPOCHS), "--min-accuracy", "0.8", "--out-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=environ,
    )
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result, out


def test_the_summary_is_the_last_line_on_stdout(demo_run):
    result, _ = demo_run
    last = result.stdout.rstrip("\n").splitlines()[-1]
    match = SUMMARY.fullmatch(last)
    assert match, last
    assert float(match.group(1)) >= 0.8


def test_validation_accuracy_is_printed_after_each_epoch(demo_run):
    result, _ = demo_run
    printed = re.findall(r"epoch (\d+)/2: train_loss=\S+ val_loss=\S+ val_accuracy=(\d\.\d{4})", result.stdout)
    assert [int(epoch) for epoch, _ in printed] == list(range(1, EPOCHS + 1))


def test_the_progress_bar_shows_the_training_loss(demo_run):
    result, _ = demo_run
    assert re.search(r"Epoch 1: 100%.*train_loss_step=\d", result.stdout)


def test_the_metrics_csv_has_one_row_per_epoch(demo_run):
    result, out = demo_run
    with open(out / "metrics.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert [row["epoch"] for row in rows] == [str(epoch) for epoch in range(1, EPOCHS + 1)]
    for row in rows:
        assert 0 < float(row["train_loss"]) < 3 and 0 < float(row["val_loss"]) < 3
        assert 0.5 < float(row["val_accuracy"]) <= 1
    assert float(rows[-1]["train_loss"]) < float(rows[0]["train_loss"])  # it learns
    printed = re.findall(r"val_accuracy=(\d\.\d{4})\n", result.stdout)
    assert printed == [f"{float(row['val_accuracy']):.4f}" for row in rows]


def test_the_learning_curve_png_and_checkpoint_sit_next_to_each_other(demo_run):
    result, out = demo_run
    assert (out / "digits.ckpt").stat().st_size > 0
    if importlib.util.find_spec("matplotlib") is None:  # an optional extra: only lightning26-xla29 has it
        assert "matplotlib is not installed: no learning_curve.png (pip install matplotlib)" in result.stdout
        assert f"wrote {out / 'digits.ckpt'}, {out / 'metrics.csv'}\n" in result.stdout
        assert not (out / "learning_curve.png").exists()
        return
    picture = (out / "learning_curve.png").read_bytes()
    assert picture.startswith(b"\x89PNG\r\n\x1a\n") and len(picture) > 10_000
    assert f"wrote {out / 'digits.ckpt'}, {out / 'metrics.csv'}, {out / 'learning_curve.png'}\n" in result.stdout


def test_the_cpu_fallback_is_said_once_with_the_hint(demo_run):
    result, _ = demo_run
    output = result.stdout + result.stderr
    assert output.count("PJRT_DEVICE is not set") == 1
    assert "Set PJRT_DEVICE (TPU, CUDA, CPU, ...) to choose." in output
    assert "Defaulting to PJRT_DEVICE" not in output  # torch_xla's own notice is not repeated
    assert sum(line.startswith("trainer-plugins: ") for line in result.stderr.splitlines()) == 1


def test_the_demo_prints_no_warning_of_ours_and_one_line_at_the_end_of_its_fit(demo_run):
    # before: three LateCompilationWarnings for its own smaller last validation and test batches (remedy:
    # drop_last=True, which would drop evaluation data), the goodput table and the compile summary
    result, _ = demo_run
    output = result.stdout + result.stderr
    assert "LateCompilationWarning" not in output
    assert not re.search(r"(xla_plugins|trainer_plugins)/\S+\.py:\d+: \w*Warning", output), result.stderr[-3000:]
    assert "XLA compile monitor" not in output and "Goodput " not in output
    ours = [line for line in output.splitlines() if line.startswith("xla-plugins: ")]
    assert len(ours) == 1, ours
    assert ours[0].startswith(f"xla-plugins: fit ended at trainer.global_step={EPOCHS * 38}; ")  # 38 batches an epoch
