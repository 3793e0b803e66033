"""Hook implementations of the XLA plugin (entry point ``xla`` in the ``trainer_plugins`` group).

Importing this module imports neither torch, Lightning nor torch_xla: the declarations are plain
data, and the decision hooks import what they need when a run is configured.
"""

from __future__ import annotations

from typing import Any, Optional

from trainer_plugins import AcceleratorEntry, EnvironmentEntry, PrecisionEntry, StrategyEntry, hookimpl

TRAINER_PLUGINS_API = ">=1.0,<2"

_PKG = "xla_plugins"
#: Names of the XLA accelerator; ``"tpu"`` is Lightning's name, kept so existing scripts run unchanged.
ACCELERATOR_NAMES = ("xla", "tpu")


@hookimpl
def trainer_plugins_accelerators() -> list[AcceleratorEntry]:
    return [
        AcceleratorEntry(
            "xla",
            trainer=f"{_PKG}.accelerator:XLAAccelerator",
            description="XLA devices through torch_xla's PJRT runtime (TPU, CPU, CUDA, ...)",
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
            description="one XLA device, one process",
            deprecated_aliases=("single_tpu",),
            override=True,
        ),
        StrategyEntry(
            "xla",
            trainer=f"{_PKG}.strategies.xla:XLAStrategy",
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
            description="all devices from one process, batch sharded over a mesh (torch_xla SPMD)",
            distributed=True,
        ),
    ]


@hookimpl
def trainer_plugins_precisions() -> list[PrecisionEntry]:
    return [
        PrecisionEntry(
            "xla",
            trainer=f"{_PKG}.precision:XLAPrecision",
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
            trainer=f"{_PKG}.environment:XLAEnvironment",
            description="world size and ranks from torch_xla.runtime",
            override=True,
        )
    ]


@hookimpl
def trainer_plugins_accelerator_available(name: str) -> Optional[bool]:
    if name not in ACCELERATOR_NAMES:
        return None
    from xla_plugins._runtime import auto_candidate

    return auto_candidate()


def _is_xla_accelerator(accelerator: Any) -> bool:
    from lightning.fabric.accelerators.xla import XLAAccelerator

    return isinstance(accelerator, XLAAccelerator)


def _xla_strategy_classes(api: str) -> tuple[type, ...]:
    """The strategies that run on XLA devices: Lightning's (which this plugin's subclass) and SPMD."""
    if api == "trainer":
        from lightning.pytorch.strategies import SingleDeviceXLAStrategy, XLAStrategy

        from xla_plugins.strategies.xla_spmd import XLASPMDStrategy

        return (SingleDeviceXLAStrategy, XLAStrategy, XLASPMDStrategy)
    from lightning.fabric.strategies import SingleDeviceXLAStrategy as FabricSingle
    from lightning.fabric.strategies import XLAFSDPStrategy, XLAStrategy as FabricXLA

    return (FabricSingle, FabricXLA, XLAFSDPStrategy)


@hookimpl
def trainer_plugins_select_strategy(accelerator: Any, parallel_devices: list[Any], api: str) -> Optional[str]:
    """One device: ``single_xla``. Several: ``xla`` (Lightning's choice), unless its collectives hang here."""
    if not _is_xla_accelerator(accelerator):
        return None
    if len(parallel_devices) == 1:
        return "single_xla"
    from xla_plugins import _runtime

    if _runtime.spawn_collectives_hang():
        from lightning.fabric.utilities.rank_zero import rank_zero_info

        rank_zero_info(
            f"trainer-plugins: strategy='auto' on {len(parallel_devices)} PJRT {_runtime.device_type()} devices uses the SPMD"
            " strategy 'xla_spmd': the one-worker-per-device strategy 'xla' cannot run collectives on this device"
            " with this torch_xla."
        )
        return "xla_spmd"
    return "xla"


@hookimpl
def trainer_plugins_select_precision(accelerator: Any, strategy: Any, precision_input: Any, api: str) -> Any:
    if not (_is_xla_accelerator(accelerator) or isinstance(strategy, _xla_strategy_classes(api))):
        return None
    from xla_plugins.precision import XLAPrecision

    return XLAPrecision("32-true" if precision_input is None else precision_input)


@hookimpl
def trainer_plugins_select_environment(accelerator: Any, api: str) -> Any:
    if not _is_xla_accelerator(accelerator):
        return None
    from xla_plugins.environment import XLAEnvironment

    return XLAEnvironment()


@hookimpl
def trainer_plugins_validate(accelerator: Any, strategy: Any, parallel_devices: list[Any], api: str) -> None:
    xla_strategy = isinstance(strategy, _xla_strategy_classes(api))
    if _is_xla_accelerator(accelerator) and not xla_strategy:
        raise ValueError(
            f"The XLA accelerator cannot run strategy {type(strategy).__name__}. Use strategy='auto',"
            " 'single_xla' (one device) or 'xla' (all devices)."
        )
    if xla_strategy and not _is_xla_accelerator(accelerator):
        raise ValueError(
            f"Strategy {type(strategy).__name__} runs on XLA devices only, but the accelerator is"
            f" {type(accelerator).__name__}. Use accelerator='xla' (or 'tpu')."
        )
    from lightning.pytorch.strategies import XLAStrategy

    from xla_plugins.strategies.xla_spmd import XLASPMDStrategy

    multi_device = (XLAStrategy, XLASPMDStrategy)
    if isinstance(strategy, multi_device) and len(parallel_devices) == 1:
        raise NotImplementedError(
            f"The multi-device XLA strategy {type(strategy).__name__} cannot run on a single device."
            " Use strategy='single_xla' (or strategy='auto') for one device."
        )
    if isinstance(strategy, XLAStrategy):
        from xla_plugins import _runtime

        if _runtime.spawn_collectives_hang():
            raise NotImplementedError(
                f"The one-worker-per-device strategy 'xla' would hang in its first collective on PJRT"
                f" {_runtime.device_type()} with torch_xla {_runtime.torch_xla_version()}: it lowers cross-device"
                " collectives without a channel id. Use strategy='xla_spmd' (or strategy='auto') for several devices."
            )


@hookimpl
def trainer_plugins_doctor() -> dict[str, Any]:
    from xla_plugins import _runtime

    return _runtime.describe()
