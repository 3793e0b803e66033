"""The catalogue of names and its conflict rule."""

from __future__ import annotations

import pytest
from plugin_helpers import catalog_with, make_plugin

from trainer_plugins import AcceleratorEntry, PluginConflictError, PluginWarning, StrategyEntry


def provides_strategy(name: str, override: bool = False, cls: str = "pkg.mod:Strategy"):
    return make_plugin(strategies=lambda: [StrategyEntry(name, trainer=cls, override=override)])


def test_a_plugin_cannot_take_a_lightning_name_without_override():
    with pytest.warns(
        PluginWarning,
        match=r"strategy 'ddp' is claimed by lightning \(lightning 2.x\), npu \(npu-dist 1.0\); lightning .* wins",
    ):
        catalog = catalog_with(("npu", provides_strategy("ddp")))
    assert catalog.find("strategy", "ddp").plugin.name == "lightning"
    assert [c.describe() for c in catalog.conflicts] == [
        "strategy 'ddp' is claimed by lightning (lightning 2.x), npu (npu-dist 1.0); lightning (lightning 2.x) wins"
    ]


def test_override_takes_a_lightning_name_and_the_takeover_is_reported():
    catalog = catalog_with(("npu", provides_strategy("ddp", override=True)))
    assert catalog.find("strategy", "ddp").plugin.name == "npu"
    assert "npu (npu-dist 1.0) wins" in catalog.conflicts[0].describe()


def test_two_plugins_claiming_one_name_without_override_both_lose_it():
    with pytest.warns(PluginWarning, match="none declared override=True"):
        catalog = catalog_with(("first", provides_strategy("fast")), ("second", provides_strategy("fast")))
    with pytest.raises(
        PluginConflictError, match=r"strategy 'fast' is claimed by first \(first-dist 1.0\), second \(second-dist 1.0\)"
    ):
        catalog.find("strategy", "fast")
    assert "fast" not in catalog.names("strategy", "trainer")


def test_two_plugins_claiming_one_name_one_with_override_gives_it_to_the_override():
    catalog = catalog_with(("first", provides_strategy("fast")), ("second", provides_strategy("fast", override=True)))
    assert catalog.find("strategy", "fast").plugin.name == "second"


def test_names_are_listed_per_api():
    plugin = make_plugin(
        strategies=lambda: [
            StrategyEntry("fabric_only", fabric="pkg:S"),
            StrategyEntry("both", trainer="a:S", fabric="b:S"),
        ]
    )
    catalog = catalog_with(("p", plugin), builtin=False)
    assert catalog.names("strategy", "trainer") == ["both"]
    assert catalog.names("strategy", "fabric") == ["both", "fabric_only"]


def test_deprecated_aliases_resolve_to_their_entry_but_are_listed_only_on_request():
    plugin = make_plugin(strategies=lambda: [StrategyEntry("new", trainer="a:S", deprecated_aliases=("old",))])
    catalog = catalog_with(("p", plugin), builtin=False)
    assert catalog.find("strategy", "old").deprecated and catalog.find("strategy", "old").entry.name == "new"
    assert catalog.names("strategy", "trainer") == ["new"]
    assert catalog.names("strategy", "trainer", include_deprecated=True) == ["new", "old"]


def test_a_malformed_declaration_quarantines_its_plugin():
    with pytest.warns(
        PluginWarning,
        match="hook trainer_plugins_accelerators returned a list holding the string 'npu'; expected a list of"
        " AcceleratorEntry",
    ):
        catalog = catalog_with(("npu", make_plugin(accelerators=lambda: ["npu"])))
    assert catalog.manager.records["npu"].state == "quarantined"


def test_owner_of_finds_the_closest_declared_class_in_the_mro():
    pytest.importorskip("lightning")
    catalog = catalog_with(
        (
            "fake",
            make_plugin(accelerators=lambda: [AcceleratorEntry("fake", trainer="fake_accelerators:FakeAccelerator")]),
        )
    )
    from fake_accelerators import FakeAccelerator, SubFakeAccelerator

    assert catalog.owner_of(SubFakeAccelerator(), "accelerator", "trainer").plugin.name == "fake"
    assert catalog.owner_of(FakeAccelerator(), "accelerator", "trainer").entry.name == "fake"
    from lightning.pytorch.accelerators import CPUAccelerator

    assert catalog.owner_of(CPUAccelerator(), "accelerator", "trainer").plugin.name == "lightning"


def test_one_plugin_declaring_a_name_twice_is_reported_and_the_name_refused():
    plugin = make_plugin(
        strategies=lambda: [StrategyEntry("twice", trainer="a:S"), StrategyEntry("twice", fabric="b:S")]
    )
    with pytest.warns(PluginWarning, match="declared 2 times by p"):
        catalog = catalog_with(("p", plugin), builtin=False)
    with pytest.raises(PluginConflictError, match=r"strategy 'twice' is declared 2 times by p \(p-dist 1.0\)"):
        catalog.find("strategy", "twice")


def test_two_plugins_both_declaring_override_are_reported_as_such():
    a = make_plugin(strategies=lambda: [StrategyEntry("npu_ddp", trainer="a:S", override=True)])
    b = make_plugin(strategies=lambda: [StrategyEntry("npu_ddp", trainer="b:S", override=True)])
    with pytest.warns(PluginWarning):
        catalog = catalog_with(("a", a), ("b", b), builtin=False)
    assert catalog.conflicts[0].describe() == (
        "strategy 'npu_ddp' is claimed by a (a-dist 1.0), b (b-dist 1.0); a (a-dist 1.0) and b (b-dist 1.0) all"
        " declared override=True, so none wins and the name is unusable"
    )


def test_a_name_two_backends_take_says_how_to_pick_each_and_one_won_needs_no_advice():
    # xla-plugins and torchtpu-plugins both take Lightning's "tpu", each under a name of its own too
    def backend(own: str):
        return make_plugin(
            accelerators=lambda: [AcceleratorEntry(own, trainer=f"{own}:A", aliases=("tpu",), override=True)]
        )

    with pytest.warns(PluginWarning):
        catalog = catalog_with(("xla", backend("xla")), ("torchtpu", backend("torchtpu")))
    (tpu,) = [conflict for conflict in catalog.conflicts if conflict.name == "tpu"]
    how = (
        "'tpu' serves none of them; for torchtpu (torchtpu-dist 1.0): accelerator='torchtpu', or"
        " TRAINER_PLUGINS_BLOCK=xla-dist; for xla (xla-dist 1.0): accelerator='xla', or"
        " TRAINER_PLUGINS_BLOCK=torchtpu-dist"
    )
    assert tpu.settle() == how
    with pytest.raises(PluginConflictError) as raised:
        catalog.find("accelerator", "tpu")
    assert str(raised.value).endswith(f"unusable. {how}.")
    won = catalog_with(("xla", backend("xla")))
    assert [conflict.settle() for conflict in won.conflicts] == [""]  # xla overrides Lightning's "tpu": it serves it
