"""Declarations: validation, names, lazy class loading."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trainer_plugins import AcceleratorEntry, StrategyEntry


def test_an_entry_answers_to_its_name_aliases_and_deprecated_aliases():
    entry = StrategyEntry("single_xla", trainer="pkg.mod:Cls", aliases=("one_xla",), deprecated_aliases=("single_tpu",))
    assert entry.names == ("single_xla", "one_xla", "single_tpu")


@pytest.mark.parametrize("name", ["", "Has Space", "UPPER", "-leading", 3])
def test_a_malformed_name_is_rejected_naming_it(name):
    with pytest.raises(ValueError, match=f"invalid name {name!r}"):
        AcceleratorEntry(name, trainer="pkg.mod:Cls")


def test_an_entry_must_name_a_class_for_at_least_one_api():
    with pytest.raises(ValueError, match=r"AcceleratorEntry\('npu'\) names no class: give `trainer=` and/or `fabric=`"):
        AcceleratorEntry("npu")


def test_a_class_path_must_be_module_colon_class():
    with pytest.raises(ValueError, match=r"class path 'pkg.mod.Cls' is not 'module:Class'"):
        AcceleratorEntry("npu", trainer="pkg.mod.Cls")


def test_class_path_is_chosen_per_api_and_unknown_apis_are_rejected():
    entry = StrategyEntry("x", trainer="a:T", fabric="b:F")
    assert (entry.class_path("trainer"), entry.class_path("fabric")) == ("a:T", "b:F")
    with pytest.raises(ValueError, match="api must be one of"):
        entry.class_path("keras")


def test_load_imports_the_class_and_checks_its_lightning_base():
    pytest.importorskip("lightning")
    from lightning.pytorch.accelerators import CPUAccelerator

    assert (
        AcceleratorEntry("cpu", trainer="lightning.pytorch.accelerators:CPUAccelerator").load("trainer")
        is CPUAccelerator
    )
    with pytest.raises(TypeError, match="must be a subclass of lightning.pytorch.accelerators.accelerator.Accelerator"):
        AcceleratorEntry("bad", trainer="collections:OrderedDict").load("trainer")
    with pytest.raises(LookupError, match="not available for lightning.Fabric"):
        AcceleratorEntry("cpu", trainer="lightning.pytorch.accelerators:CPUAccelerator").load("fabric")


def test_loaded_class_never_imports_a_module():
    code = (
        "import sys\n"
        "from trainer_plugins import AcceleratorEntry\n"
        "entry = AcceleratorEntry('x', trainer='xml.dom.minidom:Document')\n"
        "print(entry.loaded_class('trainer'), 'xml.dom.minidom' in sys.modules)\n"
        "import xml.dom.minidom\n"
        "print(entry.loaded_class('trainer').__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["None", "False", "Document"]
