"""An unchanged Lightning script on accelerator="tpu" through torchtpu-plugins, on the stand-in device.

Every run here is in-process: the torchtpu-torch* cells set TORCHTPU_PLUGINS_DEVICE=cpu, so the stand-in
"tpu" device is installed when torch loads. The same script runs on accelerator="cpu" as the reference;
the stand-in runs torch's CPU kernels, so 32-true losses are equal bit for bit (a TPU's are not).
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from plugin_helpers import catalog_with, make_plugin
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer_plugins import AcceleratorEntry, PluginConflictError, PluginWarning
from trainer_plugins.testing import PluginConformance

pytestmark = pytest.mark.torchtpu


class TestTorchTPUPluginConformance(PluginConformance):
    """The conformance kit trainer-plugins ships to plugin authors (declarations and probes import no torch)."""

    plugin = "torchtpu"


class Regression(L.LightningModule):
    """Two linear layers under Adam; records each step's loss and the first layer's output dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(8, 16)
        self.out = nn.Linear(16, 1)
        self.losses: list[float] = []
        self.hidden_dtypes: set[torch.dtype] = set()

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        hidden = self.hidden(x)
        self.hidden_dtypes.add(hidden.dtype)
        loss = nn.functional.mse_loss(self.out(torch.relu(hidden)).float(), y.float())
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.05)


class DevicesSeen(Callback):
    """The device types of the parameters and of the optimizer's non-scalar state, after every step."""

    def __init__(self) -> None:
        self.parameters: set[str] = set()
        self.optimizer_state: set[str] = set()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
        self.parameters |= {p.device.type for p in pl_module.parameters()}
        for state in trainer.optimizers[0].state.values():
            self.optimizer_state |= {v.device.type for v in state.values() if torch.is_tensor(v) and v.ndim > 0}


def _loader() -> DataLoader:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(32, 8, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=32)  # one step per epoch


def _fit(accelerator: str, precision: str = "32-true", epochs: int = 4, ckpt_path=None, save_in=None):  # type: ignore[no-untyped-def]
    """Fit ``epochs`` one-step epochs; with ``save_in``, ModelCheckpoint writes ``last.ckpt`` there during the fit."""
    L.seed_everything(0, verbose=False)
    model, seen = Regression(), DevicesSeen()
    saving = [ModelCheckpoint(dirpath=save_in, save_top_k=0, save_last=True)] if save_in is not None else []
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=1,
        precision=precision,
        max_epochs=epochs,
        callbacks=[seen, *saving],
        logger=False,
        enable_checkpointing=bool(saving),
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, _loader(), ckpt_path=ckpt_path)
    return trainer, model, seen


@pytest.mark.parametrize(
    ("precision", "tolerance", "hidden_dtype"),
    [("32-true", 0.0, torch.float32), ("bf16-true", 2e-2, torch.bfloat16), ("bf16-mixed", 2e-2, torch.bfloat16)],
)
def test_losses_equal_the_cpu_run_with_the_precision_on_tpu(precision, tolerance, hidden_dtype):
    trainer, tpu, seen = _fit("tpu", precision)
    _, cpu, _ = _fit("cpu", precision)
    assert trainer.strategy.root_device == torch.device("tpu", 0)
    assert (seen.parameters, seen.optimizer_state) == ({"tpu"}, {"tpu"})
    # bf16-mixed: autocast ran on "tpu" (Lightning alone would autocast "cuda" and leave the Linear in float32)
    assert tpu.hidden_dtypes == cpu.hidden_dtypes == {hidden_dtype}
    assert len(tpu.losses) == 4
    if tolerance == 0.0:
        assert tpu.losses == cpu.losses
    else:
        torch.testing.assert_close(tpu.losses, cpu.losses, rtol=tolerance, atol=tolerance)


def test_a_checkpoint_written_on_tpu_holds_cpu_tensors_and_resumes_on_cpu_then_on_tpu(tmp_path):
    _, whole, _ = _fit("tpu", epochs=4)
    # written during the fit, while the model and the optimizer state are on "tpu" (after it, Lightning moves them)
    _fit("tpu", epochs=2, save_in=tmp_path / "tpu")
    checkpoint = torch.load(tmp_path / "tpu" / "last.ckpt", weights_only=False)  # no map_location: as written
    tensors = [*checkpoint["state_dict"].values()]
    for state in checkpoint["optimizer_states"][0]["state"].values():
        tensors += [v for v in state.values() if torch.is_tensor(v)]
    assert {t.device.type for t in tensors} == {"cpu"}
    _, on_cpu, _ = _fit("cpu", epochs=3, ckpt_path=tmp_path / "tpu" / "last.ckpt", save_in=tmp_path / "cpu")
    _, back_on_tpu, seen = _fit("tpu", epochs=4, ckpt_path=tmp_path / "cpu" / "last.ckpt")
    assert on_cpu.losses + back_on_tpu.losses == whole.losses[2:]
    assert seen.optimizer_state == {"tpu"}


def test_strategy_auto_with_one_device_is_the_single_device_strategy_on_tpu():
    trainer = L.Trainer(accelerator="tpu", devices=1, logger=False)
    assert type(trainer.strategy).__name__ == "TorchTPUSingleDeviceStrategy"
    assert trainer.strategy.root_device == torch.device("tpu", 0)


@pytest.mark.parametrize(
    ("name", "strategy", "start_method"),
    [
        ("ddp", "TorchTPUDDPStrategy", "popen"),
        ("ddp_find_unused_parameters_false", "TorchTPUDDPStrategy", "popen"),
        ("ddp_spawn", "TorchTPUDDPStrategy", "spawn"),
        ("single_device", "TorchTPUSingleDeviceStrategy", None),
        ("fsdp", "TorchTPUFSDPStrategy", None),
    ],
)
def test_lightnings_strategy_names_on_tpu_build_this_plugins_strategies(name, strategy, start_method):
    trainer = L.Trainer(accelerator="tpu", devices=1, strategy=name, logger=False)
    assert type(trainer.strategy).__name__ == strategy
    assert trainer.strategy.root_device == torch.device("tpu", 0)
    assert getattr(trainer.strategy, "_start_method", None) == start_method
    decision = next(d for d in trainer._accelerator_connector.plugin_connector.explanation if d.role == "strategy")
    assert decision.plugin.startswith("torchtpu ") and f"Lightning's name {name!r}" in decision.reason


@pytest.mark.parametrize(
    ("name", "strategy", "start_method"),
    [("ddp", "FabricTorchTPUDDPStrategy", "popen"), ("ddp_spawn", "FabricTorchTPUDDPStrategy", "spawn"),
     ("fsdp", "FabricTorchTPUFSDPStrategy", None)],
)  # fmt: skip
def test_fabric_strategies_by_lightnings_name_on_tpu_are_this_plugins(name, strategy, start_method):
    fabric = L.Fabric(accelerator="tpu", devices=1, strategy=name)
    assert type(fabric.strategy).__name__ == strategy
    assert getattr(fabric.strategy, "_start_method", None) == start_method


@pytest.mark.parametrize("name", ["auto", "ddp"])
def test_two_devices_counted_by_a_mock_get_ddp_on_tpu_from_auto_and_from_ddp(name, monkeypatch):
    from torchtpu_plugins.runtime import _probes

    monkeypatch.setattr(_probes, "device_count", lambda: 2)  # the stand-in of this process reports one device
    trainer = L.Trainer(accelerator="tpu", devices="auto", strategy=name, logger=False)
    assert type(trainer.strategy).__name__ == "TorchTPUDDPStrategy"
    assert trainer.strategy.parallel_devices == [torch.device("tpu", 0), torch.device("tpu", 1)]
    fabric = L.Fabric(accelerator="tpu", devices=2, strategy=name)
    assert type(fabric.strategy).__name__ == "FabricTorchTPUDDPStrategy"


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("ddp_fork", "TorchTPU cannot fork"),
        ("ddp_notebook", "TorchTPU cannot fork"),
        ("ddp_find_unused_parameters_true", "marks find_unused_parameters=True as failing"),
        ("deepspeed", "no 'tpu' form"),
    ],
)
def test_lightnings_names_with_no_tpu_form_are_refused_naming_those_that_run(name, why):
    with pytest.raises(ValueError, match=rf"strategy={name!r} cannot run on accelerator 'tpu'.*{why}.*'ddp' \(ddp_"):
        L.Trainer(accelerator="tpu", devices=1, strategy=name, logger=False)


def test_a_strategy_instance_is_used_as_given_and_lightnings_own_ddp_instance_refused():
    from lightning.pytorch.strategies import DDPStrategy

    from torchtpu_plugins.strategies.ddp import TorchTPUDDPStrategy

    mine = TorchTPUDDPStrategy(start_method="spawn")
    assert L.Trainer(accelerator="tpu", devices=1, strategy=mine, logger=False).strategy is mine
    with pytest.raises(ValueError, match=r"DDPStrategy cannot run on accelerator 'tpu'.*strategy='ddp' by name"):
        L.Trainer(accelerator="tpu", devices=1, strategy=DDPStrategy(), logger=False)


def test_a_pinned_lightning_name_is_used_as_given(monkeypatch):
    monkeypatch.setenv("TRAINER_PLUGINS_PIN_STRATEGY", "ddp")
    with pytest.raises(ValueError, match=r"DDPStrategy cannot run on accelerator 'tpu'"):
        L.Trainer(accelerator="tpu", devices=1, logger=False)


def test_an_unsupported_precision_on_tpu_is_refused_naming_the_valid_ones():
    with pytest.raises(ValueError, match=r"precision='16-mixed'.*valid: 32-true, bf16-true, bf16-mixed"):
        L.Trainer(accelerator="tpu", devices=1, precision="16-mixed", logger=False)


def test_no_tpu_device_registered_mocked_says_not_available_and_why(monkeypatch):
    from torchtpu_plugins.roles.accelerator import TorchTPUAccelerator

    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *args, **kwargs: None)
    assert not TorchTPUAccelerator.is_available()
    assert TorchTPUAccelerator.auto_device_count() == 0
    with pytest.raises(RuntimeError, match=r"not available: torch reports no accelerator.*TORCHTPU_PLUGINS_DEVICE=cpu"):
        L.Trainer(accelerator="tpu", devices=1, logger=False)


def test_doctor_rows_show_torch_the_stand_in_and_the_devices_seen():
    from torchtpu_plugins import _hooks

    rows = _hooks.trainer_plugins_doctor()
    assert rows["torch"] == torch.__version__.split("+")[0] or rows["torch"] == torch.__version__
    assert rows["torch-tpu"] == rows["libtpu"] == "not installed"
    assert rows["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "unset (backends load)"
    assert rows["stand-in device"] == "TORCHTPU_PLUGINS_DEVICE=cpu"
    assert rows["'tpu' devices"] == torch.accelerator.device_count() == 1


def test_with_a_second_claimant_of_tpu_neither_serves_it_and_each_keeps_its_own_name():
    from torchtpu_plugins import _hooks

    xla_like = make_plugin(
        accelerators=lambda: [
            AcceleratorEntry("xla", trainer="tests.x:X", aliases=("tpu",), auto_priority=100, override=True)
        ]
    )
    with pytest.warns(PluginWarning, match=r"'tpu'.*all declared override=True"):
        catalog = catalog_with(("torchtpu", _hooks), ("xla", xla_like))
    with pytest.raises(PluginConflictError, match=r"accelerator 'tpu' is claimed by .*torchtpu.*xla"):
        catalog.find("accelerator", "tpu")
    assert catalog.find("accelerator", "torchtpu").plugin.name == "torchtpu"
    assert catalog.find("accelerator", "xla").plugin.name == "xla"


def _fabric_losses(accelerator: str, precision: str) -> tuple[list[float], set[str], object]:
    fabric = L.Fabric(accelerator=accelerator, devices=1, precision=precision)
    fabric.seed_everything(0, verbose=False)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(_loader())
    losses, devices = [], set()
    for _ in range(4):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x).float(), y.float())
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
            devices |= {p.device.type for p in model.parameters()}
            for state in optimizer.state.values():
                devices |= {v.device.type for v in state.values() if torch.is_tensor(v) and v.ndim > 0}
    return losses, devices, fabric


@pytest.mark.parametrize(("precision", "tolerance"), [("32-true", 0.0), ("bf16-true", 2e-2), ("bf16-mixed", 2e-2)])
def test_fabric_on_tpu_equals_fabric_on_cpu(precision, tolerance):
    tpu, devices, fabric = _fabric_losses("tpu", precision)
    cpu, _, _ = _fabric_losses("cpu", precision)
    assert fabric.device == torch.device("tpu", 0)
    assert type(fabric.strategy).__name__ == "FabricTorchTPUSingleDeviceStrategy"
    assert devices == {"tpu"}
    if precision == "bf16-mixed":
        assert fabric._precision.device == "tpu"
    if tolerance == 0.0:
        assert tpu == cpu
    else:
        torch.testing.assert_close(tpu, cpu, rtol=tolerance, atol=tolerance)
