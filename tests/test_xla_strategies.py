"""XLA strategies and accelerator in this process (one PJRT CPU device): contracts that need no launch."""

from __future__ import annotations

import copy
from importlib.metadata import PackageNotFoundError
from unittest import mock

import pytest

pytestmark = pytest.mark.xla

L = pytest.importorskip("lightning")
import torch  # noqa: E402
from lightning.pytorch.utilities.exceptions import MisconfigurationException  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import xla_plugins  # noqa: E402


def quiet_trainer(**flags) -> L.Trainer:
    defaults = dict(
        accelerator="xla",
        devices=1,
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    return L.Trainer(**{**defaults, **flags})


def data() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,))), batch_size=4)


class SkipsBackward(L.LightningModule):
    def __init__(self, manual: bool = False) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 2)
        self.automatic_optimization = not manual
        self.steps = 0

    def training_step(self, batch, batch_idx):
        self.steps += 1
        if not self.automatic_optimization:
            optimizer = self.optimizers()
            optimizer.zero_grad()
            self.manual_backward(self.layer(batch[0]).sum())
            optimizer.step()
        return None

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_returning_none_from_training_step_under_automatic_optimization_is_rejected():
    with pytest.raises(
        MisconfigurationException, match="Skipping backward is not supported on XLA with automatic optimization"
    ):
        quiet_trainer().fit(SkipsBackward(), data())


def test_manual_optimization_may_return_none():
    model = SkipsBackward(manual=True)
    quiet_trainer().fit(model, data())
    assert model.steps == 2


def test_before_launch_the_spawn_strategy_has_placeholders_and_harmless_collectives():
    strategy = xla_plugins.XLAStrategy(parallel_devices=[torch.device("xla", i) for i in range(4)])
    assert (strategy.world_size, strategy.global_rank, strategy.local_rank, strategy.node_rank) == (1, 0, 0, 0)
    assert strategy.distributed_sampler_kwargs == {"num_replicas": 1, "rank": 0}
    with pytest.raises(RuntimeError, match="no root device before its workers are launched"):
        _ = strategy.root_device
    strategy.barrier()
    strategy.barrier(None)
    assert strategy.broadcast({"a": 1}) == {"a": 1}
    assert (
        "is_distributed" not in vars(type(strategy))
        and type(strategy.cluster_environment).__module__ == "xla_plugins.roles.environment"
    )


def test_dataloaders_are_wrapped_in_mp_device_loader_exactly_once():
    from torch_xla.distributed.parallel_loader import MpDeviceLoader

    strategy = xla_plugins.XLAStrategy(parallel_devices=[torch.device("xla", 0), torch.device("xla", 1)])
    strategy._launched = True  # as inside a worker
    loader = data()
    wrapped = strategy.process_dataloader(loader)
    assert isinstance(wrapped, MpDeviceLoader)
    assert wrapped.dataset is loader.dataset and wrapped.batch_sampler is loader.batch_sampler
    assert strategy.process_dataloader(wrapped) is wrapped


def test_spmd_strategy_collectives_follow_lightnings_one_process_semantics():
    strategy = xla_plugins.XLASPMDStrategy(parallel_devices=[torch.device("xla", 0), torch.device("xla", 1)])
    tensor = torch.arange(4.0)
    for op in ("mean", "avg", "sum", "max", "min", "MAX", None, torch.distributed.ReduceOp.MIN):
        assert strategy.reduce(tensor, reduce_op=op) is tensor  # one process: already the global value
    assert strategy.all_gather(tensor) is tensor
    assert strategy.broadcast("payload") == "payload"
    assert strategy.distributed_sampler_kwargs is None  # no sampler injected: the loader's order is dealt out
    assert (strategy.world_size, strategy.global_rank, strategy.root_device) == (1, 0, torch.device("xla", 0))
    with pytest.raises(
        ValueError, match="reduce with one of 'sum', 'mean', 'avg', 'max', 'min'.*got reduce_op='product'"
    ):
        strategy.reduce(tensor, reduce_op="product")


def test_spmd_batch_meaning_is_per_device_by_default_and_validated():
    devices = [torch.device("xla", 0), torch.device("xla", 1)]
    assert xla_plugins.XLASPMDStrategy(parallel_devices=devices).batch == "per_device"
    assert xla_plugins.XLASPMDStrategy(parallel_devices=devices, batch="global").batch == "global"
    with pytest.raises(
        ValueError, match="`batch='local'` is not a batch meaning. Choose one of 'per_device', 'global'"
    ):
        xla_plugins.XLASPMDStrategy(parallel_devices=devices, batch="local")


def test_spmd_is_not_distributed_for_lightning_one_process_drives_the_mesh():
    import trainer_plugins

    devices = [torch.device("xla", 0), torch.device("xla", 1)]
    for api, strategy in [
        ("trainer", xla_plugins.XLASPMDStrategy(parallel_devices=devices)),
        ("fabric", xla_plugins.FabricXLASPMDStrategy(parallel_devices=devices)),
    ]:
        assert trainer_plugins.Connector(api).is_distributed(strategy) is False


def test_global_batches_join_per_device_batches_field_by_field():
    from xla_plugins.strategies._batches import GlobalBatches, concatenate

    batches = [
        {"x": torch.full((2, 3), float(i)), "names": [f"a{i}", f"b{i}"], "pair": (torch.tensor([i]), [torch.ones(1)])}
        for i in range(3)
    ]
    joined = concatenate(batches)
    assert joined["x"].shape == (6, 3) and joined["x"][:, 0].tolist() == [0, 0, 1, 1, 2, 2]
    assert joined["names"] == ["a0", "b0", "a1", "b1", "a2", "b2"]
    assert joined["pair"][0].tolist() == [0, 1, 2] and joined["pair"][1][0].shape == (3,)
    loader = DataLoader(TensorDataset(torch.arange(10)), batch_size=2)  # 5 per-device batches
    grouped = GlobalBatches(loader, per_step=2)
    assert len(grouped) == 3 and [b[0].tolist() for b in grouped] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert grouped.dataset is loader.dataset and grouped.batch_size == 2
    copied = copy.copy(grouped)
    assert copied.loader is loader and len(copied) == 3


def test_device_stats_are_empty_where_the_runtime_has_no_memory_statistics():
    assert xla_plugins.XLAAccelerator().get_device_stats(torch.device("xla", 0)) == {}


def test_device_stats_report_memory_in_mib_from_torch_xla_memory_info():
    """Mocked: only a TPU/GPU runtime reports memory; the values are torch_xla 2.9's documented example."""
    info = {"bytes_used": 290816, "bytes_limit": 34088157184, "peak_bytes_used": 500816}
    with mock.patch("torch_xla.core.xla_model.get_memory_info", return_value=info):
        stats = xla_plugins.XLAAccelerator().get_device_stats(torch.device("xla", 0))
    assert stats == {
        "memory.used (MiB)": 290816 / 2**20,
        "memory.free (MiB)": (34088157184 - 290816) / 2**20,
        "memory.limit (MiB)": 34088157184 / 2**20,
        "memory.peak (MiB)": 500816 / 2**20,
    }


@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
def test_a_backward_pass_before_the_xla_runtime_started_gives_a_clear_error():
    from conftest import run_python

    result = run_python(
        """
        import torch
        from lightning.pytorch.demos.boring_classes import BoringModel
        import lightning as L
        x = torch.ones(2, requires_grad=True)
        (x * 2).sum().backward()  # the process's first backward pass, on the CPU
        try:
            L.Trainer(accelerator="xla", devices=1, max_steps=1, logger=False).fit(BoringModel())
        except RuntimeError as error:
            print("error:", error)
        """
    )
    assert "error: This process ran a backward pass before starting the XLA runtime" in result.stdout


def test_a_torch_that_does_not_match_torch_xla_is_refused_with_matching_versions_named(monkeypatch):
    from packaging.version import Version

    from xla_plugins.runtime import _probes

    monkeypatch.setattr(_probes, "version", lambda name: "2.7.0" if name == "torch" else "2.9.0")
    with pytest.raises(
        RuntimeError,
        match=r"torch_xla 2\.9\.0 is built against torch 2\.9\.0, but torch 2\.7\.0 is installed;"
        r" install the matching pair: pip install 'torch==2\.9\.0' 'torch_xla==2\.9\.0'",
    ):
        _probes._check_versions.__wrapped__(Version("2.9.0"))
    with pytest.raises(
        RuntimeError, match=r"torch_xla 2\.7\.0 is too old for the XLA plugin; it needs torch_xla>=2\.8"
    ):
        _probes._check_versions.__wrapped__(Version("2.7.0"))


@pytest.mark.parametrize(
    ("torch_xla", "torch", "needed"),
    [
        ("2.9.0", "2.9.1", "2.9.0"),  # same minor, another release: torch_xla 2.9.0 is built against 2.9.0
        ("2.9.0", "2.8.0", "2.9.0"),
        ("2.8.1", "2.9.0", "2.8.0"),
        ("2.8.1", "2.8.0", None),  # torch_xla 2.8.1 is built against torch 2.8.0
        ("2.9.0", "2.9.0+cu128", None),  # a build tag is the same release
        ("2.10.0", "2.10.2", None),  # an untested series: same major.minor is enough
        ("2.10.0", "2.9.0", "2.10.*"),
    ],
)
def test_a_torch_xla_torch_pair_matches_only_the_torch_release_torch_xla_is_built_against(torch_xla, torch, needed):
    from packaging.version import Version

    from xla_plugins.runtime._probes import version_mismatch

    message = version_mismatch(Version(torch_xla), Version(torch))
    if needed is None:
        assert message is None
    else:
        assert message == (
            f"torch_xla {torch_xla} is built against torch {needed}, but torch {torch} is installed;"
            f" install the matching pair: pip install 'torch=={needed}' 'torch_xla=={torch_xla}'"
        )


def test_doctor_reports_a_mismatched_torch_torch_xla_pair_as_an_error_with_the_fix(monkeypatch):
    from xla_plugins import _doctor
    from xla_plugins.runtime import _probes

    versions = {"torch": "2.9.1", "torch_xla": "2.9.0"}

    def version(name: str) -> str:
        if name not in versions:
            raise PackageNotFoundError(name)  # torch_tpu, torchax, ...: not installed
        return versions[name]

    monkeypatch.setattr(_probes, "version", version)  # what the checks read
    monkeypatch.setattr(_doctor, "version", version)  # what doctor shows
    _probes._check_versions.cache_clear()  # the real pair may have been checked (and cached) already
    try:
        info = _doctor.describe()
    finally:
        _probes._check_versions.cache_clear()
    assert info["torch"] == "2.9.1" and info["torch_xla"] == "2.9.0"
    assert info["error"] == (
        "RuntimeError: torch_xla 2.9.0 is built against torch 2.9.0, but torch 2.9.1 is installed;"
        " install the matching pair: pip install 'torch==2.9.0' 'torch_xla==2.9.0'."
    )


def test_the_xrt_runtime_is_refused():
    """Mocked: torch_xla >= 2.5 cannot run XRT at all, so only a missing PJRT device type can stand for it."""
    from xla_plugins.runtime import _probes

    with mock.patch("torch_xla.runtime.device_type", return_value=None):
        with pytest.raises(RuntimeError, match="The XLA XRT runtime is not supported anymore"):
            _probes.require_torch_xla()


class NeedsTwoArguments(Exception):
    def __init__(self, step: int, reason: str) -> None:
        super().__init__(f"step {step}: {reason}")


def test_a_worker_exception_that_cannot_be_rebuilt_still_reaches_the_user_with_its_traceback():
    from xla_plugins.strategies.launchers._failures import _report, _reported_failure

    try:
        raise NeedsTwoArguments(3, "diverged")
    except NeedsTwoArguments as error:
        report = _report(1, error)
    error, worker_traceback = _reported_failure(*report)
    assert isinstance(error, RuntimeError)
    assert str(error) == "XLA replica of rank 1 failed: test_xla_strategies.NeedsTwoArguments: step 3: diverged"
    assert 'raise NeedsTwoArguments(3, "diverged")' in str(worker_traceback)


def test_parse_devices_accepts_auto_and_lists_the_choices_for_unreadable_strings():
    count = xla_plugins.XLAAccelerator.auto_device_count()
    assert xla_plugins.XLAAccelerator.parse_devices("auto") == count
    with pytest.raises(ValueError, match=r"`devices` can only be 'auto', 1 or \[0\] for XLA, got '\[0\]'\. The PJRT"):
        xla_plugins.XLAAccelerator.parse_devices("[0]")


def test_every_class_the_docs_name_at_the_package_root_is_exported_from_its_folder():
    """``xla_plugins.<Name>`` is the stable path of what users build or catch, whichever folder holds the class."""
    import re
    from pathlib import Path

    docs = Path(__file__).resolve().parents[1] / "docs"
    named = {m for f in docs.glob("*.md") for m in re.findall(r"`xla_plugins\.([A-Z]\w+)", f.read_text())}
    assert {"LateCompilationWarning", "WorkerDiedError", "XLAProgressBar"} <= named <= set(xla_plugins.__all__)
    for name in xla_plugins.__all__:
        exported = getattr(xla_plugins, name)
        assert exported.__name__ == name and exported.__module__.startswith("xla_plugins."), name
