"""The contract with torch_xla's internals: every private torch_xla name the XLA plugin relies on.

torch_xla keeps some of what the plugin needs behind private names: the worker start-up its own
``xmp.spawn`` runs (``torch_xla._internal.pjrt``), the per-host process counts
(``torch_xla._internal.{tpu,neuron,gpu}``), C++ bindings of ``torch_xla._XLAC`` (runtime state,
shardings, a tensor's pending state), the one-transfer copy to the CPU of ``xla_model``, and
attributes torch_xla sets on objects it wraps; and one private torch function that torch_xla
would call if it registered a device module (``torch._register_device_module``). Each is listed
once in :data:`NAMES`, with what it is and its parameters, and the plugin reaches it only through
the functions and names below; no other module of the plugin names a private torch_xla attribute.
``tests/test_torch_xla_contract.py`` checks :data:`NAMES` with :func:`contract_violations` on the
torch_xla of every tox cell (2.8 and 2.9), and reads the plugin's sources for private torch_xla
names used elsewhere.

Nothing here imports torch_xla until a function is called; each call looks the name up anew, so a
replacement installed on torch_xla's module (a test harness's) is the one called.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pkgutil import resolve_name as _resolve
from typing import Any, NamedTuple, Optional

#: A Python function: its parameter names are checked (``inspect.signature``).
FUNCTION = "function"
#: A C++ binding of ``torch_xla._XLAC``: its parameter names as pybind11 writes them in its docstring.
BINDING = "binding"
#: An attribute torch_xla assigns on an object: the function or class named before it assigns it
#: (``.<name> =`` in its source).
ASSIGNED = "assigned attribute"


class PrivateName(NamedTuple):
    """A private torch_xla name: where it is, what it is, what it takes, and which releases have it.

    ``path`` is the module to import, ``:``, then the attribute path (``"torch_xla:_XLAC.<binding>"``);
    ``kind`` is :data:`FUNCTION`, :data:`BINDING` or :data:`ASSIGNED`; ``parameters`` are the
    parameter names of a function or binding (none for an assigned attribute); ``versions`` is a
    ``packaging`` specifier of the torch_xla releases that have it (``""``: every supported release).
    """

    path: str
    kind: str
    parameters: tuple[str, ...] = ()
    versions: str = ""

    @property
    def name(self) -> str:
        """The attribute's own name (the last part of :attr:`path`)."""
        return self.path.rpartition(".")[2].rpartition(":")[2]


_PJRT = "torch_xla._internal.pjrt"
_FSDP_V2 = "torch_xla.experimental.spmd_fully_sharded_data_parallel:SpmdFullyShardedDataParallel"
_CHECKPOINT_MODULE = "torch_xla.distributed.fsdp.utils:checkpoint_module"

# the launchers: torch_xla's worker start-up and its process counts, as ``xmp.spawn`` uses them
RUN_THREAD_PER_DEVICE = PrivateName(
    f"{_PJRT}:_run_thread_per_device", FUNCTION, ("local_rank", "local_world_size", "fn", "initializer_fn")
)
INITIALIZE_MULTIPROCESS = PrivateName(f"{_PJRT}:initialize_multiprocess", FUNCTION, ("local_rank", "local_world_size"))
#: ``num_local_processes`` of each PJRT device type whose module has one (CUDA's: torch_xla 2.8 only).
NUM_LOCAL_PROCESSES = {
    "TPU": PrivateName("torch_xla._internal.tpu:num_local_processes", FUNCTION),
    "NEURON": PrivateName("torch_xla._internal.neuron:num_local_processes", FUNCTION),
    "CUDA": PrivateName("torch_xla._internal.gpu:num_local_processes", FUNCTION, versions="<2.9"),
}
# the runtime adapter and auto-detection
RUNTIME_IS_INITIALIZED = PrivateName("torch_xla:_XLAC._xla_runtime_is_initialized", BINDING)
# the persistent compilation cache: whether the process compiled already (torch_xla.runtime.initialize_cache's check)
COMPUTATION_CACHE_IS_INITIALIZED = PrivateName("torch_xla:_XLAC._xla_computation_cache_is_initialized", BINDING)
NUM_AVAILABLE_TPU_CHIPS = PrivateName("torch_xla._internal.tpu:num_available_chips", FUNCTION)
# the metric reads
CONVERT_TO_CPU = PrivateName("torch_xla.core.xla_model:_maybe_convert_to_cpu", FUNCTION, ("data", "convert"))
TENSOR_DEBUG_INFO = PrivateName("torch_xla:_XLAC._get_xla_tensor_debug_info", BINDING, ("arg0",))
# the compile monitor: torch_xla's counters and metrics, read at every hook boundary
COUNTER_VALUE = PrivateName("torch_xla:_XLAC._xla_counter_value", BINDING, ("arg0",))
METRIC_DATA = PrivateName("torch_xla:_XLAC._xla_metric_data", BINDING, ("arg0",))
# the FSDPv2 strategy: shardings of loaded optimizer state, the wrappers' own attributes
OP_SHARDING = PrivateName("torch_xla:_XLAC._get_xla_op_sharding", BINDING, ("arg0",))
SHARDING_SPEC = PrivateName("torch_xla:_XLAC._get_xla_sharding_spec", BINDING, ("arg0",))
MARK_SHARDING = PrivateName("torch_xla:_XLAC._xla_mark_sharding", BINDING, ("arg0", "arg1"))
#: torch_xla's staging step of asynchronous sharded saves (``CheckpointManager.save_async`` runs it).
SHARDED_CPU_STATE_DICT = PrivateName(
    "torch_xla.experimental.distributed_checkpoint._helpers:_sharded_cpu_state_dict", FUNCTION, ("state_dict",)
)
#: Where ``SpmdFullyShardedDataParallel`` keeps the wrapped module (its state-dict keys' prefix).
FSDP_V2_WRAPPED_MODULE = PrivateName(f"{_FSDP_V2}._orig_module", ASSIGNED)
#: What ``checkpoint_module`` adds to a module besides its new ``forward``.
CHECKPOINTED_FORWARDS = (
    PrivateName(f"{_CHECKPOINT_MODULE}._xla_checkpointed_forward_original", ASSIGNED),
    PrivateName(f"{_CHECKPOINT_MODULE}._xla_checkpointed_forward_no_kwargs", ASSIGNED),
)
#: torch's own (private) registration of a device type's runtime module as ``torch.<device_type>``:
#: torch_xla registers none, so the plugin registers ``xla_plugins.runtime.device_module`` as ``torch.xla``.
REGISTER_DEVICE_MODULE = PrivateName("torch:_register_device_module", FUNCTION, ("device_type", "module"))

#: Every private torch_xla name the plugin uses.
NAMES: tuple[PrivateName, ...] = (
    RUN_THREAD_PER_DEVICE,
    INITIALIZE_MULTIPROCESS,
    *NUM_LOCAL_PROCESSES.values(),
    RUNTIME_IS_INITIALIZED,
    COMPUTATION_CACHE_IS_INITIALIZED,
    NUM_AVAILABLE_TPU_CHIPS,
    CONVERT_TO_CPU,
    TENSOR_DEBUG_INFO,
    COUNTER_VALUE,
    METRIC_DATA,
    OP_SHARDING,
    SHARDING_SPEC,
    MARK_SHARDING,
    SHARDED_CPU_STATE_DICT,
    FSDP_V2_WRAPPED_MODULE,
    *CHECKPOINTED_FORWARDS,
    REGISTER_DEVICE_MODULE,
)


def run_thread_per_device(local_rank: int, local_world_size: int, fn: Any, initializer_fn: Any) -> Any:
    """``torch_xla._internal.pjrt._run_thread_per_device``: a worker's replica threads, as ``xmp.spawn`` runs them."""
    return _resolve(RUN_THREAD_PER_DEVICE.path)(local_rank, local_world_size, fn, initializer_fn)


def initialize_multiprocess(local_rank: int, local_world_size: int) -> None:
    """``torch_xla._internal.pjrt.initialize_multiprocess``: torch_xla's start-up of one worker process."""
    _resolve(INITIALIZE_MULTIPROCESS.path)(local_rank, local_world_size)


def num_local_processes(device_type: str) -> Optional[int]:
    """``num_local_processes()`` of ``torch_xla._internal.<tpu|neuron|gpu>`` for PJRT ``device_type``.

    ``None`` for a device type without such a module in the installed torch_xla (CPU; CUDA from 2.9).
    """
    name = NUM_LOCAL_PROCESSES.get(device_type)
    if name is None:
        return None
    try:
        return int(_resolve(name.path)())
    except ImportError:
        return None


def num_available_tpu_chips() -> int:
    """``torch_xla._internal.tpu.num_available_chips``: TPU chips found on the PCI bus (starts no runtime)."""
    return int(_resolve(NUM_AVAILABLE_TPU_CHIPS.path)())


def runtime_is_initialized() -> bool:
    """``torch_xla._XLAC._xla_runtime_is_initialized``: whether this process runs the PJRT runtime."""
    return bool(_resolve(RUNTIME_IS_INITIALIZED.path)())


def computation_cache_is_initialized() -> bool:
    """Whether this process's compilation cache is set up (it is at the first compilation)."""
    return bool(_resolve(COMPUTATION_CACHE_IS_INITIALIZED.path)())


def convert_to_cpu(data: Any) -> Any:
    """``torch_xla.core.xla_model._maybe_convert_to_cpu``: the XLA tensors of ``data`` on the CPU, in one transfer."""
    return _resolve(CONVERT_TO_CPU.path)(data)


def tensor_debug_info(tensor: Any) -> str:
    """``torch_xla._XLAC._get_xla_tensor_debug_info``: torch_xla's description of an XLA tensor's state."""
    return str(_resolve(TENSOR_DEBUG_INFO.path)(tensor))


def metric_readers() -> tuple[Any, Any]:
    """``torch_xla._XLAC._xla_counter_value`` and ``_xla_metric_data``, resolved now, to call many times.

    The bindings behind ``torch_xla.debug.metrics.counter_value`` and ``metric_data`` (a counter's
    value or ``None``; a metric's ``(total samples, accumulator, samples)`` or ``None``), without the
    Python wrapper: the compile monitor reads them at every hook boundary.
    """
    return _resolve(COUNTER_VALUE.path), _resolve(METRIC_DATA.path)


def op_sharding(tensor: Any) -> Any:
    """``torch_xla._XLAC._get_xla_op_sharding``: the sharding of an XLA tensor (``None`` if it has none)."""
    return _resolve(OP_SHARDING.path)(tensor)


def sharding_spec(tensor: Any) -> str:
    """``torch_xla._XLAC._get_xla_sharding_spec``: the sharding of an XLA tensor as text (empty if none)."""
    return str(_resolve(SHARDING_SPEC.path)(tensor))


def mark_sharding(tensor: Any, sharding: Any) -> None:
    """``torch_xla._XLAC._xla_mark_sharding``: give ``tensor`` the sharding :func:`op_sharding` returned."""
    _resolve(MARK_SHARDING.path)(tensor, sharding)


def sharded_cpu_state_dict(state_dict: Any) -> Any:
    """``torch_xla.experimental.distributed_checkpoint._helpers._sharded_cpu_state_dict``: ``state_dict`` with each
    sharded XLA tensor as its CPU shards (torch_xla's ``_CpuShards``, which its ``SPMDSavePlanner`` writes) and each
    other XLA tensor on the CPU, in one transfer per kind."""
    return _resolve(SHARDED_CPU_STATE_DICT.path)(state_dict)


def register_device_module(device_type: str, module: Any) -> None:
    """``torch._register_device_module``: make ``module`` torch's runtime module of ``device_type`` (``torch.<type>``).

    Raises:
        RuntimeError: a module is registered for ``device_type`` already (torch's check).
    """
    _resolve(REGISTER_DEVICE_MODULE.path)(device_type, module)


def _binding_parameters(function: Any) -> tuple[str, ...]:
    """The parameter names of a pybind11 function, from its docstring's first line ``name(a: T, b: U = 1) -> R``."""
    line = (function.__doc__ or "").partition("\n")[0]
    inside = line.partition("(")[2].rpartition(") ->")[0]
    names, depth, start = [], 0, 0
    for index, char in enumerate(inside + ","):
        depth += (char in "[(") - (char in "])")
        if char == "," and depth == 0:
            parameter = inside[start:index].partition(":")[0].strip()
            if parameter:
                names.append(parameter)
            start = index + 1
    return tuple(names)


def contract_violations(names: Sequence[PrivateName] = NAMES, torch_xla_version: Optional[str] = None) -> list[str]:
    """What of ``names`` the installed torch_xla lacks or changed.

    Args:
        names: the private names to check; default :data:`NAMES`.
        torch_xla_version: the release to check against (default: the installed one); a name whose
            :attr:`PrivateName.versions` excludes it is not checked.

    Returns:
        One line per missing name, wrong kind or changed parameters; empty when the contract holds.
    """
    from importlib.metadata import version

    from packaging.specifiers import SpecifierSet

    release = torch_xla_version or version("torch_xla")
    problems = []
    for name in names:
        if name.versions and not SpecifierSet(name.versions).contains(release, prereleases=True):
            continue
        owner_path = name.path.rpartition(".")[0] if name.kind == ASSIGNED else name.path
        try:
            found = _resolve(owner_path)
        except (ImportError, AttributeError) as error:
            problems.append(f"{owner_path}: missing ({type(error).__name__}: {error})")
            continue
        if name.kind == ASSIGNED:
            if f".{name.name} =" not in inspect.getsource(found):
                problems.append(f"{owner_path}: assigns no attribute {name.name}")
            continue
        if name.kind == FUNCTION and inspect.isfunction(found):
            parameters = tuple(inspect.signature(found).parameters)
        elif name.kind == BINDING and inspect.isbuiltin(found):
            parameters = _binding_parameters(found)
        else:
            problems.append(f"{name.path}: a {type(found).__name__}, expected a {name.kind}")
            continue
        if parameters != name.parameters:
            problems.append(f"{name.path}: parameters {parameters}, expected {name.parameters}")
    return problems
