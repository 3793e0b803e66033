"""The private torch_xla names the XLA plugin relies on exist on the installed torch_xla, and it reaches no other.

Every tox cell runs these, so the contract (``xla_plugins.runtime._torch_xla_contract``) is checked on each
supported torch_xla: 2.8 (py311-lightning25-xla28, py311-lightning26-xla28) and 2.9 (the other two).
"""

from __future__ import annotations

import ast
import inspect
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.version import Version

from xla_plugins.runtime import _torch_xla_contract as contract
from xla_plugins.runtime._torch_xla_contract import BINDING, FUNCTION, PrivateName, contract_violations

pytestmark = pytest.mark.xla

#: Private torch_xla names the project's test harness, test scripts and benchmarks use (not the
#: plugin's: the harness re-lowers collectives, the scripts and benchmarks read device shards).
HARNESS_NAMES = (
    PrivateName("torch_xla:_XLAC._xla_step_marker", BINDING, ("device", "devices", "wait", "reset_scope")),
    PrivateName("torch_xla:_XLAC._xla_spmd_all_reduce", BINDING, ("arg0", "arg1", "arg2", "arg3")),
    PrivateName("torch_xla:_XLAC._xla_all_gather", BINDING, tuple(f"arg{i}" for i in range(7))),
    PrivateName("torch_xla:_XLAC._xla_reduce_scatter", BINDING, tuple(f"arg{i}" for i in range(10))),
    PrivateName("torch_xla:_XLAC._get_all_reduce_token", BINDING, ("arg0",)),
    PrivateName("torch_xla:_XLAC._xla_get_default_device", BINDING),
    PrivateName("torch_xla:_XLAC._xla_wait_device_ops", BINDING, ("devices",)),
    PrivateName("torch_xla:_XLAC._xla_real_devices", BINDING, ("devices",)),
    PrivateName("torch_xla:_XLAC._get_local_shards", BINDING, ("arg0",)),
    PrivateName(
        "torch_xla.core.xla_model:_all_gather_using_all_reduce", FUNCTION, ("value", "dim", "groups", "pin_layout")
    ),
)

PLUGIN = Path(contract.__file__).parents[1]  # the xla_plugins package (the contract is in its runtime/)


def test_every_private_torch_xla_name_the_plugin_relies_on_exists_with_the_expected_kind_and_parameters():
    assert contract_violations() == [], f"torch_xla {version('torch_xla')}"


def test_every_private_torch_xla_name_the_tests_and_benchmarks_rely_on_exists_with_the_expected_parameters():
    assert contract_violations(HARNESS_NAMES) == [], f"torch_xla {version('torch_xla')}"


def test_a_missing_name_a_changed_signature_and_a_binding_of_another_arity_are_reported(monkeypatch):
    from torch_xla._internal import pjrt

    monkeypatch.delattr(pjrt, "_run_thread_per_device")
    monkeypatch.setattr(pjrt, "initialize_multiprocess", lambda local_rank, world_size: None)
    changed_binding = contract.MARK_SHARDING._replace(parameters=("arg0",))
    assert contract_violations([contract.RUN_THREAD_PER_DEVICE, contract.INITIALIZE_MULTIPROCESS, changed_binding]) == [
        "torch_xla._internal.pjrt:_run_thread_per_device: missing (AttributeError: module"
        " 'torch_xla._internal.pjrt' has no attribute '_run_thread_per_device')",
        "torch_xla._internal.pjrt:initialize_multiprocess: parameters ('local_rank', 'world_size'),"
        " expected ('local_rank', 'local_world_size')",
        "torch_xla:_XLAC._xla_mark_sharding: parameters ('arg0', 'arg1'), expected ('arg0',)",
    ]


def test_an_attribute_torch_xla_no_longer_assigns_is_reported():
    renamed = PrivateName(
        f"{contract.FSDP_V2_WRAPPED_MODULE.path.rpartition('.')[0]}._wrapped_module", "assigned attribute"
    )
    assert contract_violations([renamed]) == [
        "torch_xla.experimental.spmd_fully_sharded_data_parallel:SpmdFullyShardedDataParallel:"
        " assigns no attribute _wrapped_module"
    ]


def test_the_cuda_process_count_is_checked_only_on_the_torch_xla_that_has_it(monkeypatch):
    cuda = contract.NUM_LOCAL_PROCESSES["CUDA"]
    assert contract_violations([cuda], torch_xla_version="2.9.0") == []  # not expected there: not checked
    problems = contract_violations([cuda], torch_xla_version="2.8.0")
    if Version(version("torch_xla")).release[:2] < (2, 9):
        assert problems == []
        monkeypatch.setenv("GPU_NUM_DEVICES", "2")  # torch_xla 2.8 reads the count from it
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "0")  # which it copies here: restored after the test
        assert contract.num_local_processes("CUDA") == 2
    else:  # torch_xla 2.9 has no CUDA device: the launcher starts one process (see num_local_processes)
        assert problems == [
            "torch_xla._internal.gpu:num_local_processes: missing (ModuleNotFoundError: No module named"
            " 'torch_xla._internal.gpu')"
        ]
        assert contract.num_local_processes("CUDA") is None


# --- no private torch_xla name outside the contract -------------------------------------------------


def private_torch_xla_uses(source: str) -> list[str]:
    """The private torch_xla names ``source`` reaches: imports of private modules or names, attributes
    with a leading underscore (read or ``getattr``) of names bound to torch_xla modules."""
    tree = ast.parse(source)
    bound: set[str] = set()
    found: list[str] = []

    def private(dotted: str) -> bool:
        return any(part.startswith("_") and not part.startswith("__") for part in dotted.split("."))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch_xla":
                    bound.add(alias.asname or "torch_xla")
                    if private(alias.name):
                        found.append(alias.name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch_xla":
            for alias in node.names:
                bound.add(alias.asname or alias.name)
                if private(f"{node.module}.{alias.name}"):
                    found.append(f"{node.module}.{alias.name}")

    def root(node: ast.expr) -> str | None:
        while isinstance(node, ast.Attribute):
            node = node.value
        return node.id if isinstance(node, ast.Name) else None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr) and root(node.value) in bound:
            found.append(ast.unparse(node))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) >= 2
            and root(node.args[0]) in bound
            and isinstance(node.args[1], ast.Constant)
            and private(str(node.args[1].value))
        ):
            found.append(f"{ast.unparse(node.args[0])}.{node.args[1].value}")
    return found


def test_the_source_scan_finds_each_way_of_reaching_a_private_torch_xla_name():
    source = """
import torch_xla
import torch_xla.core.xla_model as xm
from torch_xla._internal import pjrt
from torch_xla import _XLAC
import torch_xla.runtime as xr

torch_xla._XLAC._xla_runtime_is_initialized()
xm._maybe_convert_to_cpu([])
getattr(xr, "_private_thing")
torch_xla.sync()
xr.global_ordinal()
"""
    assert sorted(private_torch_xla_uses(source)) == sorted(
        [
            "torch_xla._internal.pjrt",
            "torch_xla._XLAC",
            "torch_xla._XLAC",
            "torch_xla._XLAC._xla_runtime_is_initialized",
            "xm._maybe_convert_to_cpu",
            "xr._private_thing",
        ]
    )


def test_no_plugin_module_but_the_contract_reaches_a_private_torch_xla_name():
    uses = {
        str(path.relative_to(PLUGIN)): private_torch_xla_uses(path.read_text())
        for path in sorted(PLUGIN.rglob("*.py"))
        if path.name != "_torch_xla_contract.py"
    }
    assert {module: names for module, names in uses.items() if names} == {}
    assert len(uses) > 20  # every module of the plugin was read


def code_strings(source: str) -> list[str]:
    """The string constants of ``source``, docstrings left out."""
    tree = ast.parse(source)
    documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, documented) and node.body and isinstance(node.body[0], ast.Expr)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_the_attribute_names_torch_xla_assigns_are_spelled_only_in_the_contract():
    names = [contract.FSDP_V2_WRAPPED_MODULE.name, *(name.name for name in contract.CHECKPOINTED_FORWARDS)]
    spelled = {
        str(path.relative_to(PLUGIN)): [
            name for name in names if any(name in text for text in code_strings(path.read_text()))
        ]
        for path in PLUGIN.rglob("*.py")
        if path.name != "_torch_xla_contract.py"
    }
    assert {module: found for module, found in spelled.items() if found} == {}
    assert code_strings('"""doc"""\nx = "_orig_module."') == ["_orig_module."]


def test_every_function_of_the_contract_is_used_by_the_plugin():
    used = set()
    for path in PLUGIN.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if node.value.id == "_torch_xla_contract":
                    used.add(node.attr)
    functions = {
        name
        for name, value in vars(contract).items()
        if inspect.isfunction(value) and value.__module__ == contract.__name__ and not name.startswith("_")
    }
    assert functions - {"contract_violations"} <= used
    assert len(functions) > 8
