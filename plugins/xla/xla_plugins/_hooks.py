"""Hook implementations of the XLA plugin (entry point ``xla`` in the ``trainer_plugins`` group).

Importing this module imports neither torch, Lightning nor torch_xla: the declarations are plain
data, and the decision hooks import what they need when a run is configured.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from trainer_plugins import (
    AcceleratorEntry,
    EnvironmentEntry,
    PrecisionEntry,
    StrategyEntry,
    hookimpl,
    package_of,
    resolve_in,
)

TRAINER_PLUGINS_API = ">=1.1,<2"

_PKG = "xla_plugins"
#: Names of the XLA accelerator; ``"tpu"`` is Lightning's name, kept so existing scripts run unchanged.
ACCELERATOR_NAMES = ("xla", "tpu")


@hookimpl
def trainer_plugins_accelerators() -> list[AcceleratorEntry]:
    return [
        AcceleratorEntry(
            "xla",
            trainer=f"{_PKG}.roles.accelerator:XLAAccelerator",
            fabric=f"{_PKG}.roles.accelerator:XLAAccelerator",
            description="XLA devices through torch_xla's PJRT runtime (TPU, CPU, ...)",
            aliases=("tpu",),
            auto_priority=100,
            override=True,
        )
    ]


@hookimpl
def trainer_plugins_strategies() -> list[StrategyEntry]:
    return [
        StrategyEntry(
            "single_xla",
            trainer=f"{_PKG}.strategies.single_xla:SingleDeviceXLAStrategy",
            fabric=f"{_PKG}.strategies.single_xla:FabricSingleDeviceXLAStrategy",
            description="one XLA device, one process",
            supports_compile=True,
            deprecated_aliases=("single_tpu",),
            override=True,
        ),
        StrategyEntry(
            "xla",
            trainer=f"{_PKG}.strategies.xla:XLAStrategy",
            fabric=f"{_PKG}.strategies.xla:FabricXLAStrategy",
            description="all devices, one worker per device (torch_xla multiprocessing)",
            distributed=True,
            override=True,
        ),
        StrategyEntry(
            "xla_debug",
            trainer=f"{_PKG}.strategies.xla:XLAStrategy",
            description="'xla' with PT_XLA_DEBUG=1",
            init_kwargs={"debug": True},
            distributed=True,
            override=True,
        ),
        StrategyEntry(
            "xla_spmd",
            trainer=f"{_PKG}.strategies.xla_spmd:XLASPMDStrategy",
            fabric=f"{_PKG}.strategies.xla_spmd:FabricXLASPMDStrategy",
            description="all devices from one process, batch sharded over a mesh (torch_xla SPMD)",
        ),
        StrategyEntry(
            "xla_fsdp_v2",
            trainer=f"{_PKG}.strategies.xla_fsdp_v2:XLAFSDPv2Strategy",
            fabric=f"{_PKG}.strategies.xla_fsdp_v2:FabricXLAFSDPv2Strategy",
            description="parameters, gradients and optimizer state sharded over a mesh (torch_xla SPMD FSDPv2)",
        ),
    ]


@hookimpl
def trainer_plugins_precisions() -> list[PrecisionEntry]:
    return [
        PrecisionEntry(
            "xla",
            trainer=f"{_PKG}.roles.precision:XLAPrecision",
            fabric=f"{_PKG}.roles.precision:FabricXLAPrecision",
            description="true 32/16/bf16 precision on XLA",
            precisions=("32-true", "16-true", "bf16-true"),
            override=True,
        )
    ]


@hookimpl
def trainer_plugins_environments() -> list[EnvironmentEntry]:
    return [
        EnvironmentEntry(
            "xla",
            trainer=f"{_PKG}.roles.environment:XLAEnvironment",
            fabric=f"{_PKG}.roles.environment:XLAEnvironment",
            description="world size and ranks from torch_xla.runtime",
            override=True,
        )
    ]


@hookimpl
def trainer_plugins_accelerator_available(name: str) -> Optional[bool]:
    if name not in ACCELERATOR_NAMES:
        return None
    from xla_plugins.roles._detection import auto_candidate

    return auto_candidate()


# The hooks serve both Lightning packagings (``lightning`` and ``pytorch_lightning``): each class is
# looked up in the packaging of the objects the hook is given (``trainer_plugins.resolve_in``).


def _is_xla_accelerator(accelerator: Any) -> bool:
    return isinstance(
        accelerator, resolve_in("lightning.fabric.accelerators.xla:XLAAccelerator", package_of(accelerator))
    )


class _XLAStrategies(NamedTuple):
    """The strategy classes that run on XLA devices for one api (this plugin's subclass Lightning's)."""

    every: tuple[type, ...]
    multi_device: tuple[type, ...]
    one_worker_per_device: tuple[type, ...]


def _xla_strategies(api: str, package: str) -> _XLAStrategies:
    def classes(*paths: str) -> tuple[type, ...]:
        return tuple(resolve_in(path, package) for path in paths)

    if api == "trainer":
        single = classes("lightning.pytorch.strategies:SingleDeviceXLAStrategy")
        spawn = classes("lightning.pytorch.strategies:XLAStrategy")
        spmd = classes(f"{_PKG}.strategies.xla_spmd:XLASPMDStrategy")
    else:
        single = classes("lightning.fabric.strategies:SingleDeviceXLAStrategy")
        spawn = classes("lightning.fabric.strategies:XLAStrategy", "lightning.fabric.strategies:XLAFSDPStrategy")
        spmd = classes(f"{_PKG}.strategies.xla_spmd:FabricXLASPMDStrategy")
    return _XLAStrategies(single + spawn + spmd, spawn + spmd, spawn)


@hookimpl
def trainer_plugins_select_strategy(accelerator: Any, parallel_devices: list[Any]) -> Optional[str]:
    """One device: ``single_xla``. Several: ``xla`` (Lightning's choice), unless its collectives hang here."""
    if not _is_xla_accelerator(accelerator):
        return None
    if len(parallel_devices) == 1:
        return "single_xla"
    from xla_plugins.roles.environment import started_by_torchrun
    from xla_plugins.runtime import _probes

    if not started_by_torchrun() and _probes.spawn_collectives_hang():
        from lightning.fabric.utilities.rank_zero import rank_zero_info

        # at INFO, as the run's start-up line that names the strategy: why not Lightning's 'xla'
        rank_zero_info(
            f"xla-plugins: strategy='auto' chose 'xla_spmd' for {len(parallel_devices)} PJRT"
            f" {_probes.device_type()} devices: the one-worker-per-device strategy 'xla' cannot run collectives on"
            " this device with this torch_xla. The loader's batch_size stays the per-device batch, as with 'xla'."
        )
        return "xla_spmd"
    return "xla"


@hookimpl
def trainer_plugins_select_precision(accelerator: Any, strategy: Any, precision_input: Any, api: str) -> Any:
    package = package_of(accelerator)
    if not (_is_xla_accelerator(accelerator) or isinstance(strategy, _xla_strategies(api, package).every)):
        return None
    name = "XLAPrecision" if api == "trainer" else "FabricXLAPrecision"
    precision_class = resolve_in(f"{_PKG}.roles.precision:{name}", package)
    return precision_class("32-true" if precision_input is None else precision_input)


@hookimpl
def trainer_plugins_select_environment(accelerator: Any) -> Any:
    if not _is_xla_accelerator(accelerator):
        return None
    return resolve_in(f"{_PKG}.roles.environment:process_environment", package_of(accelerator))()


@hookimpl
def trainer_plugins_validate(accelerator: Any, strategy: Any, parallel_devices: list[Any], api: str) -> None:
    strategies = _xla_strategies(api, package_of(accelerator))
    on_xla = _is_xla_accelerator(accelerator)
    if on_xla and not isinstance(strategy, strategies.every):
        raise ValueError(
            f"The XLA accelerator cannot run strategy {type(strategy).__name__}. Use strategy='auto',"
            " 'single_xla' (one device), 'xla' or 'xla_spmd' (all devices)."
        )
    if not on_xla and isinstance(strategy, strategies.every):
        raise ValueError(
            f"Strategy {type(strategy).__name__} runs on XLA devices only, but the accelerator is"
            f" {type(accelerator).__name__}. Use accelerator='xla' (or 'tpu')."
        )
    if isinstance(strategy, strategies.multi_device) and len(parallel_devices) == 1:
        raise NotImplementedError(
            f"The multi-device XLA strategy {type(strategy).__name__} cannot run on a single device."
            " Use strategy='single_xla' (or strategy='auto') for one device."
        )
    if isinstance(strategy, strategies.one_worker_per_device):
        from xla_plugins.roles.environment import started_by_torchrun
        from xla_plugins.runtime import _probes

        # under torchrun each process drives one device from its main thread: no cross-thread collectives
        if not started_by_torchrun() and _probes.spawn_collectives_hang():
            raise NotImplementedError(
                f"The one-worker-per-device strategy {type(strategy).__name__} would hang in its first collective on"
                f" PJRT {_probes.device_type()} with torch_xla {_probes.torch_xla_version()}: it lowers cross-device"
                " collectives without a channel id. Use strategy='xla_spmd' (or strategy='auto') for several devices."
            )


#: How Lightning's last connector check (``_lazy_init_strategy``, Trainer and Fabric, Lightning 2.5 and 2.6)
#: words its refusal of an XLA accelerator with a strategy class other than Lightning's own XLA ones.
LIGHTNING_XLA_REFUSAL = "The `XLAAccelerator` can only be used with"


@hookimpl
def trainer_plugins_accept_lightning_refusal(
    error: ValueError, accelerator: Any, strategy: Any, api: str
) -> Optional[bool]:
    """Accept Lightning's refusal of an XLA strategy of this plugin (``xla_spmd``, ``xla_fsdp_v2``) on XLA.

    Lightning accepts only its own XLA strategy classes on an ``XLAAccelerator``; the SPMD strategies
    subclass Lightning's ``ParallelStrategy`` instead, and by now passed
    :func:`trainer_plugins_validate`. ``None`` for any other refusal or pairing.
    """
    if not (str(error).startswith(LIGHTNING_XLA_REFUSAL) and _is_xla_accelerator(accelerator)):
        return None
    return isinstance(strategy, _xla_strategies(api, package_of(accelerator)).every)


@hookimpl
def trainer_plugins_doctor() -> dict[str, Any]:
    from xla_plugins import _doctor

    return _doctor.describe()
