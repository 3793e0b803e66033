"""The connector's is_distributed: whitelist, then the strategy's own attribute, then False (SPEC)."""

from __future__ import annotations

import pytest

L = pytest.importorskip("lightning")
import torch  # noqa: E402
from lightning.fabric.plugins.environments import LightningEnvironment  # noqa: E402
from lightning.pytorch.strategies import DDPStrategy, ParallelStrategy, SingleDeviceStrategy  # noqa: E402
from plugin_helpers import make_plugin  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402

from trainer_plugins import StrategyEntry  # noqa: E402


class HalfOfTwoReplicas(ParallelStrategy):
    """One process that presents itself as rank 0 of 2 replicas, so an injected sampler takes half the data."""

    def __init__(self) -> None:
        super().__init__(parallel_devices=[torch.device("cpu")], cluster_environment=LightningEnvironment())

    @property
    def root_device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        return {"num_replicas": 2, "rank": 0}

    def model_to_device(self) -> None:
        self.model.to(self.root_device)

    def reduce(self, tensor, group=None, reduce_op="mean"):
        return tensor

    def barrier(self, name=None) -> None:
        pass

    def broadcast(self, obj, src=0):
        return obj

    def all_gather(self, tensor, group=None, sync_grads=False):
        return tensor


class SaysDistributed(HalfOfTwoReplicas):
    is_distributed = True


class SaysNotDistributed(HalfOfTwoReplicas):
    is_distributed = False


class MethodSaysNotDistributed(HalfOfTwoReplicas):
    def is_distributed(self) -> bool:  # a method, not a property: called, never read as a truthy bound method
        return False


class MethodSaysDistributed(HalfOfTwoReplicas):
    def is_distributed(self) -> bool:
        return True


class PropertyRaisesAttributeError(HalfOfTwoReplicas):
    @property
    def is_distributed(self) -> bool:
        return self.cluster_environment.no_such_attribute  # a bug in the strategy, not "no attribute"


class SaysMaybe(HalfOfTwoReplicas):
    is_distributed = "maybe"


class CountingModel(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.indices: list[int] = []

    def training_step(self, batch, batch_idx):
        x, index = batch
        self.indices.extend(index.tolist())
        return self.layer(x).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(strategy) -> tuple[L.Trainer, CountingModel]:
    model = CountingModel()
    data = DataLoader(TensorDataset(torch.randn(8, 2), torch.arange(8)), batch_size=1)
    trainer = L.Trainer(
        accelerator="cpu",
        strategy=strategy,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    trainer.fit(model, data)
    return trainer, model


def test_a_custom_strategy_saying_it_is_distributed_gets_a_sampler_from_its_kwargs():
    trainer, model = fit(SaysDistributed())
    assert trainer._accelerator_connector.is_distributed is True
    sampler = trainer.train_dataloader.sampler
    assert isinstance(sampler, DistributedSampler) and (sampler.num_replicas, sampler.rank) == (2, 0)
    assert len(model.indices) == 4 and len(set(model.indices)) == 4


@pytest.mark.parametrize("strategy_class", [HalfOfTwoReplicas, SaysNotDistributed])
def test_a_custom_strategy_without_the_attribute_or_saying_false_gets_no_sampler(strategy_class):
    trainer, model = fit(strategy_class())
    assert trainer._accelerator_connector.is_distributed is False
    assert not isinstance(trainer.train_dataloader.sampler, DistributedSampler)
    assert sorted(model.indices) == list(range(8))


def test_an_is_distributed_method_is_called():
    trainer, model = fit(MethodSaysNotDistributed())
    assert trainer._accelerator_connector.is_distributed is False
    assert not isinstance(trainer.train_dataloader.sampler, DistributedSampler)
    assert sorted(model.indices) == list(range(8))
    trainer, model = fit(MethodSaysDistributed())
    assert trainer._accelerator_connector.is_distributed is True
    assert len(model.indices) == 4


def test_an_is_distributed_property_raising_attribute_error_propagates_naming_the_class():
    with pytest.raises(AttributeError, match="no_such_attribute") as info:
        L.Trainer(accelerator="cpu", strategy=PropertyRaisesAttributeError(), logger=False)
    if hasattr(info.value, "__notes__"):  # Python >= 3.11
        assert "PropertyRaisesAttributeError.is_distributed" in info.value.__notes__[0]


def test_an_is_distributed_answer_that_is_not_a_bool_is_an_error_naming_the_class():
    with pytest.raises(TypeError, match=r"SaysMaybe\.is_distributed must be a bool .* got 'maybe'"):
        L.Trainer(accelerator="cpu", strategy=SaysMaybe(), logger=False)


def test_a_strategy_a_plugin_declares_distributed_is_whitelisted_without_the_attribute(extra_plugins):
    declares = make_plugin(
        strategies=lambda: [
            StrategyEntry("half_of_two", trainer="test_is_distributed:HalfOfTwoReplicas", distributed=True)
        ]
    )
    extra_plugins("halves", declares)
    trainer, model = fit("half_of_two")
    assert type(trainer.strategy) is HalfOfTwoReplicas
    assert trainer._accelerator_connector.is_distributed is True
    assert len(model.indices) == 4


def test_lightnings_whitelist_is_kept():
    connector = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False)._accelerator_connector
    assert isinstance(connector.strategy, DDPStrategy) and connector.is_distributed is True
    single = L.Trainer(accelerator="cpu", logger=False)._accelerator_connector
    assert isinstance(single.strategy, SingleDeviceStrategy) and single.is_distributed is False


@pytest.mark.xla
def test_xla_strategies_carry_no_is_distributed_of_their_own():
    from xla_plugins import SingleDeviceXLAStrategy

    assert not any("is_distributed" in vars(cls) for cls in SingleDeviceXLAStrategy.__mro__)
