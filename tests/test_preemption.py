"""A run told to stop (SIGTERM, or a signal named in XLA_PLUGINS_CHECKPOINT_SIGNALS) writes one checkpoint and resumes.

Each run is a script in its own process: the script sends the signal to itself with ``os.kill`` from
``training_step`` at global step ``STOP_AT``, on real torch_xla (PJRT CPU). 8 batches an epoch, 2 epochs.
The tests taking ``strategy`` from :data:`BACKEND_STRATEGIES` run the same code on both backends: the
XLA plugin's ``single_xla`` (marked ``xla``) and the TorchTPU plugin's single-device and two-process DDP
strategies on the stand-in device (marked ``torchtpu``); a cell without the backend skips the case. The
other tests are the XLA plugin's (marked ``xla``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from trainer_plugins.long_runs import _stop_checkpoint, _stop_settings

#: The strategies of the tests run on both backends, marked with their backend.
BACKEND_STRATEGIES = [
    pytest.param("single_xla", marks=pytest.mark.xla),
    pytest.param("torchtpu", marks=pytest.mark.torchtpu),
    pytest.param("torchtpu_ddp", marks=pytest.mark.torchtpu),
]
#: The strategies whose processes agree on a stop at the next batch start (one batch after the one in flight).
AGREEING = ("torchtpu_ddp",)

BATCHES_PER_EPOCH = 8
EPOCHS = 2
STOP_AT = 3  # the signal is sent inside the training_step of global step 3 (the 4th batch)

SCRIPT = textwrap.dedent(
    f"""
    import os, signal, sys, time
    if os.environ.get("HARNESS"):  # the spawn strategy on PJRT CPU: real collectives between replica threads
        sys.path.insert(0, os.environ["HARNESS"])
        import xla_cpu_harness

        xla_cpu_harness.install()
    import torch, lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader, TensorDataset

    STOP_AT = int(os.environ.get("STOP_AT", "-1"))
    SIGNAL = getattr(signal, os.environ.get("STOP_SIGNAL", "SIGTERM"))
    SIGNAL_TO = os.environ.get("SIGNAL_TO", "this process")  # or "main process" (from a spawn worker's rank 0)

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            if self.global_step == STOP_AT and self.global_rank == 0:
                os.kill(os.getppid() if SIGNAL_TO == "main process" else os.getpid(), SIGNAL)
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def on_train_start(self):
            if self.global_rank == 0:
                print("START_GLOBAL_STEP", self.global_step, flush=True)

        def on_train_epoch_end(self):
            if os.environ.get("STOP_AT_EPOCH_END") == str(self.current_epoch):
                os.kill(os.getpid(), SIGNAL)

        def on_train_end(self):
            if self.global_rank == 0:  # printed where rank 0 trained (a spawn worker's copy of the Trainer)
                print("FINAL_GLOBAL_STEP", self.global_step, flush=True)

        def validation_step(self, batch, batch_idx):
            if os.environ.get("STOP_IN_VALIDATION") == "sanity check" and self.trainer.sanity_checking:
                os.kill(os.getpid(), SIGNAL)
            if os.environ.get("STOP_IN_VALIDATION") == "1" and batch_idx == 1 and not self.trainer.sanity_checking:
                os.kill(os.getpid(), SIGNAL)
            if not self.trainer.sanity_checking:
                print("VALIDATION_BATCH", self.current_epoch, batch_idx, flush=True)
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

        def on_save_checkpoint(self, checkpoint):
            if os.environ.get("SECOND_SIGNAL"):
                os.kill(os.getpid(), SIGNAL)  # a second signal while the checkpoint is being written
            if os.environ.get("SLOW_SAVE"):
                time.sleep(60)  # the deadline passes first

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            return {{"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1)}}

    torch.manual_seed(0)
    devices = int(os.environ.get("DEVICES", "1"))
    samples = {BATCHES_PER_EPOCH} * 8 * devices
    data = TensorDataset(torch.randn(samples, 4), torch.randn(samples, 1))
    callbacks = None
    if os.environ.get("USER_DIRPATH"):
        callbacks = [ModelCheckpoint(dirpath=os.environ["USER_DIRPATH"], save_last=True)]
    strategy, accelerator = os.environ["STRATEGY"], "xla"
    if strategy.startswith("torchtpu"):  # the TorchTPU plugin's strategies: its single device or DDP, by the count
        strategy, accelerator = "auto", "tpu"
    if strategy == "xla_fsdp_v2_sharded":
        from xla_plugins.strategies.xla_fsdp_v2 import XLAFSDPv2Strategy

        strategy = XLAFSDPv2Strategy(state_dict_type="sharded")
    trainer = L.Trainer(
        accelerator=accelerator, strategy=strategy, devices="auto" if devices > 1 else 1,
        max_epochs={EPOCHS}, default_root_dir=sys.argv[1], enable_progress_bar=False, callbacks=callbacks,
    )
    ckpt_path = os.environ.get("CKPT_PATH") or None
    val = DataLoader(data, batch_size=8) if os.environ.get("STOP_IN_VALIDATION") else None
    trainer.fit(Model(), DataLoader(data, batch_size=8), val, ckpt_path=ckpt_path)
    """
)


def run_script(root: Path, strategy: str = "single_xla", devices: int = 1, **env: str) -> subprocess.CompletedProcess:
    script = root.parent / "train.py"
    script.write_text(SCRIPT)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_PLUGINS_", "TRAINER_PLUGINS_"))}
    if strategy == "torchtpu_ddp":
        devices = 2
    environ.update({"PJRT_DEVICE": "CPU", "STRATEGY": strategy, "DEVICES": str(devices), **env})
    if strategy.startswith("torchtpu"):
        from test_torchtpu_distributed import _free_port

        environ.update(TORCHTPU_PLUGINS_DEVICE="cpu", TORCHTPU_PLUGINS_DEVICE_COUNT=str(devices))
        environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=_free_port(), GLOO_SOCKET_IFNAME="lo")
    elif devices > 1:
        environ["CPU_NUM_DEVICES"] = str(devices)
    return subprocess.run(
        [sys.executable, str(script), str(root)], env=environ, capture_output=True, text=True, timeout=300
    )


def output(result: subprocess.CompletedProcess) -> str:
    return result.stdout + result.stderr


def printed_global_step(result: subprocess.CompletedProcess, when: str) -> int:
    """The global step rank 0 printed when training started (``"START"``) or ended (``"FINAL"``)."""
    assert result.returncode == 0, output(result)
    lines = [line for line in result.stdout.splitlines() if line.startswith(f"{when}_GLOBAL_STEP")]
    return int(lines[-1].split()[1])


def final_global_step(result: subprocess.CompletedProcess) -> int:
    return printed_global_step(result, "FINAL")


def stop_checkpoint(root: Path) -> Path:
    return root / "checkpoints" / _stop_settings.FILENAME


def load(path: Path) -> dict:
    """A stop checkpoint: one file, or the directory of a sharded one (its ``meta.pt`` holds all but the tensors)."""
    if path.is_dir():
        return torch.load(path / "meta.pt", map_location="cpu", weights_only=False) | {"state_dict": "sharded"}
    return torch.load(path, map_location="cpu", weights_only=False)


def assert_stopped_with_a_checkpoint(
    result: subprocess.CompletedProcess, root: Path, signum: int, stopped_at: int = STOP_AT + 1
) -> dict:
    """The run exited with 128 + signum, named its checkpoint once, and the checkpoint holds step ``stopped_at``."""
    text = output(result)
    assert result.returncode == 128 + signum, text
    path = stop_checkpoint(root)
    assert path.exists(), text
    assert not Path(str(path) + ".partial").exists()
    lines = [line for line in text.splitlines() if str(path) in line and "written" in line]
    assert len(lines) == 1, text
    assert f"status {128 + signum}" in lines[0]
    checkpoint = load(path)
    assert checkpoint["global_step"] == stopped_at  # the step in flight finished
    assert checkpoint["epoch"] == 0
    progress = checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]
    assert progress["current"]["completed"] == stopped_at
    assert progress["is_last_batch"] is False  # mid-epoch
    assert {"state_dict", "lr_schedulers", "callbacks", "trainer_plugins"} <= set(checkpoint)
    assert "optimizer_states" in checkpoint or "optimizer_0" in checkpoint["__sharded_keys__"]
    return checkpoint


def stopped_at(strategy: str) -> int:
    """The global step of the stop checkpoint: the step in flight, or the next one where the processes agree."""
    return STOP_AT + (2 if strategy in AGREEING else 1)


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
@pytest.mark.parametrize("strategy", BACKEND_STRATEGIES)
def test_sigterm_in_training_step_finishes_the_step_then_writes_one_checkpoint_and_exits_143(tmp_path, strategy):
    root = tmp_path / "run"
    result = run_script(root, strategy, STOP_AT=str(STOP_AT))
    assert_stopped_with_a_checkpoint(result, root, signal.SIGTERM, stopped_at(strategy))
    assert "SIGTERMException" not in output(result)
    (line,) = [line for line in output(result).splitlines() if "Stopped by SIGTERM" in line]
    assert 'Resume with trainer.fit(..., ckpt_path="last") or TRAINER_PLUGINS_RESUME=auto.' in line


@pytest.mark.slow  # CI budget: primary tox cell and the torchtpu cells (tox.ini); DDP: tests/test_exact_resume.py
@pytest.mark.parametrize("strategy", BACKEND_STRATEGIES[:2])
def test_rerun_with_ckpt_path_last_continues_to_the_full_step_count(tmp_path, strategy):
    root = tmp_path / "run"  # Lightning's default logger and ModelCheckpoint: a new version_N folder each run
    stopped = run_script(root, strategy, STOP_AT=str(STOP_AT))
    assert_stopped_with_a_checkpoint(stopped, root, signal.SIGTERM, stopped_at(strategy))
    resumed = run_script(root, strategy, CKPT_PATH="last")
    assert f"Restoring states from the checkpoint path at {stop_checkpoint(root)}" in output(resumed)
    assert printed_global_step(resumed, "START") == stopped_at(strategy)
    assert final_global_step(resumed) == EPOCHS * BATCHES_PER_EPOCH
    assert not stop_checkpoint(root).exists()  # the finished run superseded it: "last" never goes back to it


@pytest.mark.xla
@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_ckpt_path_last_picks_the_stop_checkpoint_over_an_older_model_checkpoint_last(tmp_path):
    root, dirpath = tmp_path / "run", tmp_path / "user_checkpoints"
    # first a finished epoch with ModelCheckpoint(save_last=True) writing last.ckpt, then the stop in epoch 1
    result = run_script(root, STOP_AT=str(BATCHES_PER_EPOCH + STOP_AT), USER_DIRPATH=str(dirpath))
    assert result.returncode == 143, output(result)
    assert (dirpath / "last.ckpt").is_file()
    resumed = run_script(root, CKPT_PATH="last", USER_DIRPATH=str(dirpath))
    assert f"Restoring states from the checkpoint path at {stop_checkpoint(root)}" in output(resumed)
    assert printed_global_step(resumed, "START") == BATCHES_PER_EPOCH + STOP_AT + 1
    assert final_global_step(resumed) == EPOCHS * BATCHES_PER_EPOCH


@pytest.mark.xla
@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_auto_resume_makes_a_plain_rerun_continue_once(tmp_path):
    root = tmp_path / "run"
    stopped = run_script(root, STOP_AT=str(STOP_AT), XLA_PLUGINS_RESUME="auto")  # no checkpoint yet: starts over
    assert_stopped_with_a_checkpoint(stopped, root, signal.SIGTERM)
    # the stop message does not suggest the setting already set (issue 35 item 11)
    (line,) = [line for line in output(stopped).splitlines() if "Stopped by SIGTERM" in line]
    assert "Run the same command again to resume (XLA_PLUGINS_RESUME=auto is set)." in line
    assert "ckpt_path" not in line
    resumed = run_script(root, XLA_PLUGINS_RESUME="auto")
    assert f"Restoring states from the checkpoint path at {stop_checkpoint(root)}" in output(resumed)
    assert printed_global_step(resumed, "START") == STOP_AT + 1
    assert final_global_step(resumed) == EPOCHS * BATCHES_PER_EPOCH
    again = run_script(root, XLA_PLUGINS_RESUME="auto")  # the run finished: the next one starts over
    assert "Restoring states" not in output(again)
    assert final_global_step(again) == EPOCHS * BATCHES_PER_EPOCH


@pytest.mark.xla
@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_without_auto_resume_a_plain_rerun_starts_over(tmp_path):
    root = tmp_path / "run"
    assert_stopped_with_a_checkpoint(run_script(root, STOP_AT=str(STOP_AT)), root, signal.SIGTERM)
    fresh = run_script(root)
    assert "Restoring states" not in output(fresh)
    assert printed_global_step(fresh, "START") == 0
    assert final_global_step(fresh) == EPOCHS * BATCHES_PER_EPOCH


@pytest.mark.xla
@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_auto_resume_without_a_stop_checkpoint_starts_over_silently(tmp_path):
    root = tmp_path / "run"
    result = run_script(root, XLA_PLUGINS_RESUME="auto")
    assert "Restoring states" not in output(result)
    assert "no last checkpoint" not in output(result)
    assert final_global_step(result) == EPOCHS * BATCHES_PER_EPOCH


@pytest.mark.xla
@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_a_signal_named_in_the_setting_stops_with_a_checkpoint_and_its_own_status(tmp_path):
    root = tmp_path / "run"
    result = run_script(root, STOP_AT=str(STOP_AT), STOP_SIGNAL="SIGUSR1", XLA_PLUGINS_CHECKPOINT_SIGNALS="usr1")
    assert_stopped_with_a_checkpoint(result, root, signal.SIGUSR1)


@pytest.mark.xla
@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_a_second_signal_during_the_save_changes_nothing(tmp_path):
    root = tmp_path / "run"
    result = run_script(root, STOP_AT=str(STOP_AT), SECOND_SIGNAL="1")
    assert_stopped_with_a_checkpoint(result, root, signal.SIGTERM)


@pytest.mark.xla
@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_sigterm_during_validation_writes_the_checkpoint_there_to_run_that_validation_again(tmp_path):
    root = tmp_path / "run"  # validation after epoch 0 (8 batches); the signal at its 2nd batch
    result = run_script(root, STOP_IN_VALIDATION="1")
    assert result.returncode == 143, output(result)
    checkpoint = load(stop_checkpoint(root))
    assert checkpoint["global_step"] == BATCHES_PER_EPOCH
    # the validation restarts from its first batch (Lightning's mid-evaluation restart, nothing done)
    progress = checkpoint["loops"]["fit_loop"]["epoch_loop.val_loop.batch_progress"]
    assert progress["total"] == {"ready": 1, "started": 1, "processed": 0, "completed": 0}
    assert progress["current"] == {"ready": 1, "started": 1, "processed": 0, "completed": 0}
    resumed = run_script(root, CKPT_PATH="last", STOP_IN_VALIDATION="again")  # the same loaders, no new stop
    assert printed_global_step(resumed, "START") == BATCHES_PER_EPOCH
    assert output(resumed).count("VALIDATION_BATCH") == 2 * BATCHES_PER_EPOCH  # epoch 0's again in full, epoch 1's
    assert final_global_step(resumed) == EPOCHS * BATCHES_PER_EPOCH


@pytest.mark.xla
@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_a_rerun_without_validation_from_a_stop_during_validation_ends_at_the_uninterrupted_step_count(tmp_path):
    """Lightning 2.6.6 alone trains one batch more (17 of 16): its restarted epoch loop waits for the validation."""
    root = tmp_path / "run"
    assert run_script(root, STOP_IN_VALIDATION="1").returncode == 143
    resumed = run_script(root, CKPT_PATH="last", STOP_IN_VALIDATION="")  # no val_dataloader this time
    assert printed_global_step(resumed, "START") == BATCHES_PER_EPOCH
    assert final_global_step(resumed) == EPOCHS * BATCHES_PER_EPOCH


@pytest.mark.xla
@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_a_validation_run_again_after_a_stop_counts_its_batches_once(tmp_path):
    """Stopped in epoch 0's validation, then, resumed, at the end of epoch 0: the second checkpoint's validation
    totals are those of one whole validation, so the last rerun does not run epoch 0's validation a third time."""
    root = tmp_path / "run"
    assert run_script(root, STOP_IN_VALIDATION="1").returncode == 143
    again = run_script(root, CKPT_PATH="last", STOP_IN_VALIDATION="again", STOP_AT_EPOCH_END="0")
    assert again.returncode == 143, output(again)
    assert output(again).count("VALIDATION_BATCH 0 ") == BATCHES_PER_EPOCH
    progress = load(stop_checkpoint(root))["loops"]["fit_loop"]["epoch_loop.val_loop.batch_progress"]
    assert progress["total"] == {key: BATCHES_PER_EPOCH for key in ("ready", "started", "processed", "completed")}
    last = run_script(root, CKPT_PATH="last", STOP_IN_VALIDATION="again")
    assert output(last).count("VALIDATION_BATCH 0 ") == 0
    assert output(last).count("VALIDATION_BATCH 1 ") == BATCHES_PER_EPOCH
    assert final_global_step(last) == EPOCHS * BATCHES_PER_EPOCH


@pytest.mark.xla
@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_sigterm_during_the_sanity_check_writes_the_untrained_state_and_the_rerun_trains_it_all(tmp_path):
    root = tmp_path / "run"  # before training starts only Lightning's handler listens (SIGTERM)
    result = run_script(root, STOP_IN_VALIDATION="sanity check")
    assert result.returncode == 143, output(result)
    assert load(stop_checkpoint(root))["global_step"] == 0
    resumed = run_script(root, CKPT_PATH="last")
    assert f"Restoring states from the checkpoint path at {stop_checkpoint(root)}" in output(resumed)
    assert final_global_step(resumed) == EPOCHS * BATCHES_PER_EPOCH


@pytest.mark.xla
@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_a_save_past_the_deadline_leaves_no_checkpoint_and_exits_with_the_same_status(tmp_path):
    root = tmp_path / "run"
    result = run_script(root, STOP_AT=str(STOP_AT), SLOW_SAVE="1", XLA_PLUGINS_CHECKPOINT_DEADLINE="1")
    assert result.returncode == 143, output(result)
    assert "no checkpoint was written within 1 s" in output(result)
    assert not stop_checkpoint(root).exists()
    assert not Path(str(stop_checkpoint(root)) + ".partial").exists()


@pytest.mark.parametrize(
    ("variable", "value", "function", "named"),
    [
        (_stop_settings.SIGNALS_VARIABLE, "SIGUSR1,SIGFOO", _stop_settings.checkpoint_signals, "'SIGFOO'"),
        (_stop_settings.SIGNALS_VARIABLE, "SIGKILL", _stop_settings.checkpoint_signals, "'SIGKILL'"),
        (_stop_settings.RESUME_VARIABLE, "yes", _stop_settings.resume_mode, "'yes'"),
        (_stop_settings.DEADLINE_VARIABLE, "-3", _stop_settings.deadline_s, "'-3'"),
    ],
)
def test_bad_settings_name_the_value_and_the_choices(monkeypatch, variable, value, function, named):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError) as error:
        function()
    assert variable in str(error.value) and named in str(error.value)
    if function is _stop_settings.checkpoint_signals:
        assert ", ".join(_stop_settings.SIGNAL_CHOICES) in str(error.value)
    if function is _stop_settings.resume_mode:
        assert "off, auto" in str(error.value)


def test_settings_read_names_in_any_case_without_repeats(monkeypatch):
    monkeypatch.setenv(_stop_settings.SIGNALS_VARIABLE, " usr1, SIGUSR2 ,sigterm,SIGUSR1")
    assert _stop_settings.checkpoint_signals() == (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
    monkeypatch.delenv(_stop_settings.SIGNALS_VARIABLE)
    assert _stop_settings.checkpoint_signals() == (signal.SIGTERM,)
    assert _stop_settings.resume_mode() == "off"
    assert _stop_settings.deadline_s() == _stop_settings.DEFAULT_DEADLINE_S < 30


def test_a_backends_earlier_names_of_the_settings_stay_accepted_where_the_neutral_name_is_not_set(monkeypatch):
    """xla-plugins' XLA_PLUGINS_RESUME (and the others) still work; TRAINER_PLUGINS_RESUME wins where both are set."""
    monkeypatch.setattr(_stop_settings, "ALIASES", {variable: [] for variable in _stop_settings.ALIASES})
    for variable in ("TRAINER_PLUGINS_RESUME", "XLA_PLUGINS_RESUME", "XLA_PLUGINS_CHECKPOINT_DEADLINE"):
        monkeypatch.delenv(variable, raising=False)
    _stop_settings.accept_aliases("XLA_PLUGINS")
    _stop_settings.accept_aliases("XLA_PLUGINS")  # again: nothing changes
    assert _stop_settings.ALIASES[_stop_settings.RESUME_VARIABLE] == ["XLA_PLUGINS_RESUME"]
    monkeypatch.setenv("XLA_PLUGINS_RESUME", "auto")
    assert _stop_settings.resume_mode() == "auto"
    assert "(XLA_PLUGINS_RESUME=auto is set)" in _stop_settings.resume_hint()
    monkeypatch.setenv("XLA_PLUGINS_CHECKPOINT_DEADLINE", "5")
    assert _stop_settings.deadline_s() == 5
    monkeypatch.setenv("XLA_PLUGINS_RESUME", "sometimes")
    with pytest.raises(ValueError, match="XLA_PLUGINS_RESUME='sometimes' is not valid"):
        _stop_settings.resume_mode()
    monkeypatch.setenv("TRAINER_PLUGINS_RESUME", "off")
    assert _stop_settings.resume_mode() == "off"
    with pytest.raises(ValueError, match="'xla plugins'"):
        _stop_settings.accept_aliases("xla plugins")


@pytest.mark.xla
@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_a_bad_resume_setting_fails_the_fit_before_training(tmp_path):
    root = tmp_path / "run"
    result = run_script(root, XLA_PLUGINS_RESUME="sometimes")
    assert result.returncode == 1
    assert "XLA_PLUGINS_RESUME='sometimes' is not valid: give one of off, auto" in output(result)


@pytest.mark.xla
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["xla_spmd", "xla_fsdp_v2", "xla_fsdp_v2_sharded"])
def test_four_device_sigterm_writes_the_checkpoint_and_ckpt_path_last_resumes(tmp_path, strategy):
    root = tmp_path / "run"
    result = run_script(root, strategy=strategy, devices=4, STOP_AT=str(STOP_AT))
    assert_stopped_with_a_checkpoint(result, root, signal.SIGTERM)
    resumed = run_script(root, strategy=strategy, devices=4, CKPT_PATH="last")
    assert f"Restoring states from the checkpoint path at {stop_checkpoint(root)}" in output(resumed)
    assert printed_global_step(resumed, "START") == STOP_AT + 1
    assert final_global_step(resumed) == EPOCHS * BATCHES_PER_EPOCH


@pytest.mark.xla
@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_a_new_stop_checkpoint_replaces_the_earlier_one_file_or_sharded_directory(tmp_path):
    for kind in ("file", "directory"):
        target, source = tmp_path / f"{kind}.ckpt", tmp_path / f"{kind}.ckpt.partial"
        for path, text in ((target, "earlier"), (source, "new")):
            if kind == "file":
                path.write_text(text)
            else:
                path.mkdir()
                (path / "meta.pt").write_text(text)
        _stop_checkpoint.move(str(source), str(target))
        written = target.read_text() if kind == "file" else (target / "meta.pt").read_text()
        assert written == "new"
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(kind)) == [f"{kind}.ckpt"]


@pytest.mark.xla
@pytest.mark.slow
@pytest.mark.parametrize("signal_to", ["main process", "this process"])
def test_spawn_strategy_replicas_stop_after_one_agreed_batch_with_one_checkpoint_and_resume(tmp_path, signal_to):
    """4 replicas (threads of one worker, tests/xla_cpu_harness.py); the signal goes from rank 0 to the main process
    or to its own worker: all stop after the batch in flight plus STOP_MARGIN_BATCHES, at one step."""
    from xla_cpu_harness import required_environment

    from xla_plugins.long_runs import _stop_agreement

    root = tmp_path / "run"
    harness = {**required_environment(4), "HARNESS": str(Path(__file__).parent), "XLA_PLUGINS_REPLICA_TIMEOUT": "120"}
    result = run_script(root, strategy="xla", devices=4, STOP_AT=str(STOP_AT), SIGNAL_TO=signal_to, **harness)
    stopped_at = STOP_AT + 1 + _stop_agreement.STOP_MARGIN_BATCHES
    assert_stopped_with_a_checkpoint(result, root, signal.SIGTERM, stopped_at=stopped_at)
    resumed = run_script(root, strategy="xla", devices=4, CKPT_PATH="last", **harness)
    # (Lightning's "Restoring states" line from a worker does not always reach the output: count steps instead)
    assert printed_global_step(resumed, "START") == stopped_at
    assert final_global_step(resumed) == EPOCHS * BATCHES_PER_EPOCH


@pytest.mark.xla
@pytest.mark.slow  # 4 replica threads (tests/xla_cpu_harness.py): primary tox cell only (tox.ini)
def test_a_spawn_strategy_save_past_the_deadline_exits_with_the_stop_status_and_leaves_no_checkpoint(tmp_path):
    """The replica whose save misses the deadline ends its worker with 143; the main process exits with it too."""

    from xla_cpu_harness import required_environment

    root = tmp_path / "run"
    harness = {**required_environment(4), "HARNESS": str(Path(__file__).parent), "XLA_PLUGINS_REPLICA_TIMEOUT": "120"}
    result = run_script(
        root,
        strategy="xla",
        devices=4,
        STOP_AT=str(STOP_AT),
        SLOW_SAVE="1",
        XLA_PLUGINS_CHECKPOINT_DEADLINE="1",
        **harness,
    )
    assert result.returncode == 143, output(result)
    assert "no checkpoint was written within 1 s" in output(result)
    assert "WorkerDiedError" not in output(result)
    assert not stop_checkpoint(root).exists()
    assert not Path(str(stop_checkpoint(root)) + ".partial").exists()


class OtherHost:
    """The worker group of a simulated second host: its (signal, batches started, agreed batch) join the maximum."""

    def __init__(self, signum: int = 0, started: int = 0) -> None:
        self.values = [signum, started, 0]
        self.calls = 0

    def maximum(self, values: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return torch.maximum(values, torch.tensor(self.values))


@pytest.mark.xla
def test_on_several_hosts_a_signal_of_another_host_stops_this_one_at_the_agreed_batch():
    import multiprocessing

    from xla_plugins.long_runs import _stop_agreement

    stop = _stop_agreement.HostStop(multiprocessing.get_context("fork"))
    margin = _stop_agreement.STOP_MARGIN_BATCHES
    other = OtherHost()
    assert stop.batch_started(1, other, several_hosts=True) is None
    other.values = [int(signal.SIGTERM), 3, 0]  # the other host got SIGTERM and is one batch ahead
    assert stop.batch_started(2, other, several_hosts=True) is None  # agreed: 3 + margin
    assert stop.requested_signal() == signal.SIGTERM
    for batch in range(3, 3 + margin):
        assert stop.batch_started(batch, other, several_hosts=True) is None
    assert stop.batch_started(3 + margin, other, several_hosts=True) == signal.SIGTERM
    assert other.calls == 3 + margin  # the leading replica takes part at every batch


@pytest.mark.xla
def test_on_several_hosts_this_hosts_signal_is_a_request_until_the_hosts_agree():
    import multiprocessing
    import threading

    from xla_plugins.long_runs import _stop_agreement

    stop = _stop_agreement.HostStop(multiprocessing.get_context("fork"))
    margin = _stop_agreement.STOP_MARGIN_BATCHES
    stop.spans_hosts()
    other = OtherHost()
    assert stop.batch_started(1, other, several_hosts=True) is None
    stop.request(signal.SIGTERM)  # in batch 1: on one host the replicas would stop after batch 1 + margin
    assert stop.batch_started(2, other, several_hosts=True) is None  # agreed now: 2 + margin
    for batch in range(3, 2 + margin):
        assert stop.batch_started(batch, other, several_hosts=True) is None
    assert stop.batch_started(1 + margin, None, several_hosts=True) is None  # another replica: not the host's batch
    # another replica of the process waits at a batch until the leading replica has taken part in it
    seen: list = []
    follower = threading.Thread(target=lambda: seen.append(stop.batch_started(2 + margin, None, several_hosts=True)))
    follower.start()
    follower.join(timeout=1)
    assert follower.is_alive() and seen == []
    assert stop.batch_started(2 + margin, other, several_hosts=True) == signal.SIGTERM
    follower.join(timeout=60)
    assert seen == [signal.SIGTERM]


@pytest.mark.xla
@pytest.mark.subprocess  # a fresh interpreter: torch_xla keeps one xla:// store a process (tox.ini)
def test_the_worker_group_meets_on_torch_xlas_xla_store():
    """The agreement's group of worker processes forms through torch_xla's own xla:// rendezvous (one process
    here: on a pod every worker process of every host joins it), and its maximum is a real gloo all-reduce."""
    import socket

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    code = textwrap.dedent(
        """
        import torch
        from xla_plugins.runtime._world import World
        from xla_plugins.long_runs._stop_agreement import RENDEZVOUS, WorkerGroup

        assert RENDEZVOUS == "xla://"
        group = WorkerGroup(World(world_size=1, global_rank=0, local_rank=0, node_rank=0, num_nodes=1))
        print(group.maximum(torch.tensor([15, 4, 0])).tolist())
        """
    )
    environ = dict(os.environ, PJRT_DEVICE="CPU", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    result = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[15, 4, 0]"
