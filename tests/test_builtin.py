"""The built-in plugin's name table (trainer_plugins._builtin) equals Lightning's own registries.

Runs in every tox environment, so against each supported Lightning release (2.5.x and 2.6.x): a
Lightning release that adds, drops or moves a name fails here, not in a user's run.
"""

from __future__ import annotations

import inspect
import typing

import pytest

pytest.importorskip("lightning")
from lightning.fabric.accelerators import ACCELERATOR_REGISTRY  # noqa: E402
from lightning.fabric.plugins import environments  # noqa: E402
from lightning.fabric.plugins.precision import precision as fabric_precision  # noqa: E402
from lightning.fabric.strategies import STRATEGY_REGISTRY  # noqa: E402
from lightning.pytorch.accelerators import AcceleratorRegistry  # noqa: E402
from lightning.pytorch.strategies import StrategyRegistry  # noqa: E402

from trainer_plugins import _builtin  # noqa: E402

APIS = ("trainer", "fabric")
REGISTRIES = {
    "accelerator": {"trainer": AcceleratorRegistry, "fabric": ACCELERATOR_REGISTRY},
    "strategy": {"trainer": StrategyRegistry, "fabric": STRATEGY_REGISTRY},
}
TABLES = {"accelerator": _builtin.ACCELERATORS, "strategy": _builtin.STRATEGIES}


def declared(role: str, api: str) -> dict[str, type]:
    """Every name the table declares for ``api`` (deprecated aliases included) -> its class."""
    return {name: entry.load(api) for entry in TABLES[role] if entry.class_path(api) for name in entry.names}


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("role", ["accelerator", "strategy"])
def test_the_table_names_exactly_lightnings_registered_names_with_their_classes(role, api):
    registry = REGISTRIES[role][api]
    table = declared(role, api)
    assert sorted(table) == sorted(registry)
    deprecated = {alias for entry in TABLES[role] for alias in entry.deprecated_aliases}
    for name in registry:
        registered = registry[name][role]
        if name in deprecated:  # Lightning registers a warning shim (e.g. _graveyard's SingleTPUStrategy)
            assert issubclass(registered, table[name]), name
        else:
            assert registered is table[name], name


def test_the_table_handles_every_precision_string_lightning_accepts():
    accepted = set(typing.get_args(fabric_precision._PRECISION_INPUT_STR))  # shared by Trainer and Fabric
    handled = {precision for entry in _builtin.PRECISIONS for precision in entry.precisions}
    assert handled == accepted
    for entry in _builtin.PRECISIONS:
        for api in APIS:
            assert entry.load(api).__name__ == entry.class_path(api).split(":")[1]  # every path imports


def test_the_table_names_every_cluster_environment_lightning_ships():
    shipped = {
        cls
        for cls in vars(environments).values()
        if inspect.isclass(cls) and issubclass(cls, environments.ClusterEnvironment) and not inspect.isabstract(cls)
    }
    for api in APIS:
        assert {entry.load(api) for entry in _builtin.ENVIRONMENTS} == shipped
