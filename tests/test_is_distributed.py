"""The connector's is_distributed: whitelist, then the strategy's own attribute, then False (SPEC)."""

from __future__ import annotations

import warnings

import pytest

L = pytest.importorskip("lightning")
import torch  # noqa: E402
from lightning.fabric.plugins.environments import LightningEnvironment  # noqa: E402
from lightning.pytorch.strategies import DDPStrategy, ParallelStrategy, SingleDeviceStrategy  # noqa: E402
from plugin_helpers import make_plugin  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402

import trainer_plugins  # noqa: E402
from trainer_plugins import Connector, StrategyEntry  # noqa: E402

#: What the explanation says of each step of the rule (``trainer_plugins.explain``, ``trainer-plugins explain``).
from trainer_plugins._is_distributed import NEITHER, WHITELISTED  # noqa: E402

OWN_ATTRIBUTE = "the strategy's own is_distributed attribute"


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


class DDPSaysNotDistributed(DDPStrategy):
    is_distributed = False  # whitelisted all the same: step 1 comes before the strategy's own answer


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


def decided(strategy, api: str = "trainer") -> tuple[bool, str]:
    """The connector's answer for ``strategy`` and the step of the rule it names in the explanation."""
    connector = Connector(api)
    connector.explain_is_distributed(strategy)
    (decision,) = [d for d in connector.explanation if d.role == "is_distributed"]
    answer = connector.is_distributed(strategy)
    assert decision.choice == repr(answer)
    return answer, decision.reason


@pytest.mark.parametrize(
    ("strategy_class", "answer", "step"),
    [
        (DDPStrategy, True, WHITELISTED),
        (DDPSaysNotDistributed, True, WHITELISTED),
        (SaysDistributed, True, OWN_ATTRIBUTE),
        (SaysNotDistributed, False, OWN_ATTRIBUTE),
        (MethodSaysNotDistributed, False, OWN_ATTRIBUTE),
        (HalfOfTwoReplicas, False, NEITHER),
        (SingleDeviceStrategy, False, NEITHER),
    ],
)
def test_the_three_steps_of_the_rule_answer_in_order(strategy_class, answer, step):
    strategy = strategy_class.__new__(strategy_class)  # the rule reads the class and the attribute only
    assert decided(strategy) == (answer, step)


def registered_strategies_with_their_own_is_distributed() -> list[tuple[str, str, type]]:
    """``(name, api, class)`` of every registered strategy whose class or a base defines ``is_distributed``.

    Read from the classes themselves (the XLA plugin's import without torch_xla; their answer needs it).
    """
    found = []
    for name, claim in sorted(trainer_plugins.get_catalog().claims["strategy"].items()):
        for api in ("trainer", "fabric"):
            if claim.entry.class_path(api) is None:
                continue
            cls = claim.entry.load(api)
            if any("is_distributed" in vars(base) for base in cls.__mro__):
                found.append((name, api, cls))
    return found


WITH_THEIR_OWN = registered_strategies_with_their_own_is_distributed()
#: The registered strategies whose own ``is_distributed`` gives the answer (step 2); every other one
#: with the attribute is Lightning's DDP family (``DDPStrategy.is_distributed``, deprecated), whitelisted.
ANSWERING_FOR_THEMSELVES = {"local_sgd", "local_sgd_8", "xla_spmd", "xla_fsdp_v2"}


def test_the_strategies_answering_for_themselves_are_the_ones_this_module_tests():
    whitelisted = {
        name
        for name, api, cls in WITH_THEIR_OWN
        if isinstance(cls.__new__(cls), Connector(api).distributed_strategies())
    }
    assert {name for name, _, _ in WITH_THEIR_OWN} - whitelisted == ANSWERING_FOR_THEMSELVES
    assert {"ddp", "ddp_spawn", "deepspeed"} <= whitelisted


@pytest.mark.parametrize(
    ("name", "api", "cls"),
    [entry for entry in WITH_THEIR_OWN if entry[0] not in ANSWERING_FOR_THEMSELVES],
    ids=lambda value: value.__qualname__ if isinstance(value, type) else str(value),
)
def test_a_whitelisted_strategy_is_distributed_without_its_own_attribute_being_read(name, api, cls):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert decided(cls.__new__(cls), api) == (True, WHITELISTED)
    assert [str(w.message) for w in caught] == []  # DDPStrategy.is_distributed warns when read


@pytest.mark.parametrize(("devices", "answer"), [(1, False), (2, True)])
def test_local_sgd_answers_for_itself_by_its_process_count(devices, answer):
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy="local_sgd", logger=False)
    assert (trainer.strategy.is_distributed, trainer._accelerator_connector.is_distributed) == (answer, answer)
    assert decided(trainer.strategy) == (answer, OWN_ATTRIBUTE)


@pytest.mark.xla
@pytest.mark.parametrize("api", ["trainer", "fabric"])
@pytest.mark.parametrize("name", ["xla_spmd", "xla_fsdp_v2"])
def test_the_spmd_strategies_answer_for_themselves_by_their_host_count(name, api):
    from simulated_pod import SLICES, on_host

    cls = trainer_plugins.get_catalog().claims["strategy"][name].entry.load(api)
    devices = [torch.device("xla", 0), torch.device("xla", 1)]
    assert decided(cls(parallel_devices=devices), api) == (False, OWN_ATTRIBUTE)  # this host only
    pod = next(pod for pod in SLICES if pod.hosts > 1)
    with on_host(pod.host(1)):
        assert decided(cls(parallel_devices=devices), api) == (True, OWN_ATTRIBUTE)  # one process on each host
