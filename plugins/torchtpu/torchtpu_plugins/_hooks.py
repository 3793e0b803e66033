"""Hook implementations of the TorchTPU plugin (entry point ``torchtpu`` in the ``trainer_plugins`` group).

Importing this module imports neither torch nor Lightning: the declarations are plain data, and the
probe and decision hooks import what they need when asked.

The accelerator takes Lightning's name ``"tpu"`` (``override=True``, as xla-plugins does): a script
with ``accelerator="tpu"`` runs on TorchTPU unchanged. xla-plugins claims ``"tpu"`` the same way; the
two cannot share one torch, but where both distributions are installed the catalogue's conflict rule
leaves ``"tpu"`` to neither (selecting it raises, naming both) and each stays reachable by its own name:
``"torchtpu"`` here, ``"xla"`` there (or block one with ``TRAINER_PLUGINS_BLOCK``).
"""

from __future__ import annotations

from typing import Any, Optional

from trainer_plugins import AcceleratorEntry, StrategyEntry, hookimpl, package_of, resolve_in

TRAINER_PLUGINS_API = ">=1.3,<2"

_PKG = "torchtpu_plugins"
#: Names of the TorchTPU accelerator; ``"tpu"`` is Lightning's name, taken so existing scripts run unchanged.
ACCELERATOR_NAMES = ("torchtpu", "tpu")
#: The strategy ``strategy="auto"`` means for one ``"tpu"`` device (Trainer).
SINGLE_STRATEGY = "single_torchtpu"
#: The strategy ``strategy="auto"`` means for several ``"tpu"`` devices.
DDP_STRATEGY = "ddp_torchtpu"
#: DDP over ``"tpu_dist"`` whose processes Lightning starts with ``torch.multiprocessing``'s spawn.
DDP_SPAWN_STRATEGY = "ddp_spawn_torchtpu"
#: Fully sharded training: Lightning's FSDP2 path (``ModelParallelStrategy``) on a ``"tpu"`` mesh.
FSDP_STRATEGY = "fsdp_torchtpu"
#: Lightning's strategy names that run on ``"tpu"``, and the strategy of this plugin each means there.
LIGHTNING_NAMES = {
    "fsdp": FSDP_STRATEGY,
    "ddp": DDP_STRATEGY,
    "ddp_find_unused_parameters_false": DDP_STRATEGY,
    "ddp_spawn": DDP_SPAWN_STRATEGY,
    "ddp_spawn_find_unused_parameters_false": DDP_SPAWN_STRATEGY,
    "single_device": SINGLE_STRATEGY,
}
#: Why some of Lightning's other names cannot run on ``"tpu"`` (not verified on TPU).
_REFUSED = (
    (("fork", "notebook"), "it forks the workers (so does ddp_notebook); TorchTPU cannot fork an initialised device"),
    (("find_unused_parameters_true",), "TorchTPU's own DDP example marks find_unused_parameters=True as failing"),
)


@hookimpl
def trainer_plugins_accelerators() -> list[AcceleratorEntry]:
    return [
        AcceleratorEntry(
            "torchtpu",
            trainer=f"{_PKG}.roles.accelerator:TorchTPUAccelerator",
            fabric=f"{_PKG}.roles.accelerator:TorchTPUAccelerator",
            description="TorchTPU's native 'tpu' device (torch_tpu, or the stand-in TORCHTPU_PLUGINS_DEVICE=cpu)",
            aliases=("tpu",),
            auto_priority=90,
            override=True,
        )
    ]


@hookimpl
def trainer_plugins_strategies() -> list[StrategyEntry]:
    return [
        StrategyEntry(
            SINGLE_STRATEGY,
            trainer=f"{_PKG}.strategies.single_device:TorchTPUSingleDeviceStrategy",
            fabric=f"{_PKG}.strategies.single_device:FabricTorchTPUSingleDeviceStrategy",
            description="one 'tpu' device, one process",
        ),
        StrategyEntry(
            DDP_STRATEGY,
            trainer=f"{_PKG}.strategies.ddp:TorchTPUDDPStrategy",
            fabric=f"{_PKG}.strategies.ddp:FabricTorchTPUDDPStrategy",
            description="DDP over 'tpu_dist', one process per 'tpu' device, no device_ids",
            distributed=True,
        ),
        StrategyEntry(
            DDP_SPAWN_STRATEGY,
            trainer=f"{_PKG}.strategies.ddp:TorchTPUDDPStrategy",
            fabric=f"{_PKG}.strategies.ddp:FabricTorchTPUDDPStrategy",
            description="DDP over 'tpu_dist', one spawned process per 'tpu' device, no device_ids",
            distributed=True,
            init_kwargs={"start_method": "spawn"},
        ),
        StrategyEntry(
            FSDP_STRATEGY,
            trainer=f"{_PKG}.strategies.fsdp:TorchTPUFSDPStrategy",
            fabric=f"{_PKG}.strategies.fsdp:FabricTorchTPUFSDPStrategy",
            description="FSDP2 (fully_shard) on a 'tpu' DeviceMesh, Lightning's ModelParallelStrategy",
            distributed=True,
        ),
    ]


@hookimpl
def trainer_plugins_accelerator_available(name: str) -> Optional[bool]:
    if name not in ACCELERATOR_NAMES:
        return None
    from torchtpu_plugins.runtime import _probes

    return _probes.probably_available()


def _is_torchtpu_accelerator(accelerator: Any) -> bool:
    return isinstance(accelerator, resolve_in(f"{_PKG}.roles.accelerator:TorchTPUAccelerator", package_of(accelerator)))


def _ddp_strategies(api: str, package: str) -> tuple[type, type]:
    """(Lightning's DDPStrategy, this plugin's subclass of it) for ``api``."""
    if api == "trainer":
        return (
            resolve_in("lightning.pytorch.strategies:DDPStrategy", package),
            resolve_in(f"{_PKG}.strategies.ddp:TorchTPUDDPStrategy", package),
        )
    return (
        resolve_in("lightning.fabric.strategies:DDPStrategy", package),
        resolve_in(f"{_PKG}.strategies.ddp:FabricTorchTPUDDPStrategy", package),
    )


@hookimpl
def trainer_plugins_select_strategy(accelerator: Any, parallel_devices: list[Any]) -> Optional[str]:
    """One device: :data:`SINGLE_STRATEGY` on ``tpu:0``; several: :data:`DDP_STRATEGY`.

    Lightning 2.6 alone gives an accelerator it does not know, with ``devices=1``, a CPU strategy.
    """
    if not _is_torchtpu_accelerator(accelerator):
        return None
    return DDP_STRATEGY if len(parallel_devices) > 1 else SINGLE_STRATEGY


@hookimpl
def trainer_plugins_strategy_for_name(name: str, accelerator: Any, api: str) -> Optional[str]:
    """Lightning's strategy ``name`` on ``"tpu"``: this plugin's strategy from :data:`LIGHTNING_NAMES`.

    Raises:
        ValueError: one of Lightning's other names (``"ddp_fork"``, ``"deepspeed"``, ...), which has
            no ``"tpu"`` form here; the message says why where known, and lists the names that run.
    """
    if not _is_torchtpu_accelerator(accelerator):
        return None
    if name in LIGHTNING_NAMES:
        return LIGHTNING_NAMES[name]
    default = "torchtpu-plugins has no 'tpu' form of it"
    why = next((reason for keys, reason in _REFUSED if any(key in name for key in keys)), default)
    names = ", ".join(f"{lightning!r} ({ours})" for lightning, ours in LIGHTNING_NAMES.items())
    raise ValueError(
        f"strategy={name!r} cannot run on accelerator 'tpu' (TorchTPU): {why}. Lightning's names that run there,"
        f" with the strategy each means: {names}; or strategy='auto'."
    )


@hookimpl
def trainer_plugins_select_precision(accelerator: Any, precision: str, precision_input: Any, api: str) -> Any:
    if not _is_torchtpu_accelerator(accelerator):
        return None
    from torchtpu_plugins.roles import precision as precisions

    return precisions.build(precision, precision_input, api, package_of(accelerator))


@hookimpl
def trainer_plugins_validate(accelerator: Any, strategy: Any, parallel_devices: list[Any], api: str) -> None:
    """Reject Lightning's own ``DDPStrategy`` on ``"tpu"`` (it passes ``device_ids`` and opens a CUDA stream)."""
    lightning_ddp, torchtpu_ddp = _ddp_strategies(api, package_of(accelerator))
    on_tpu = _is_torchtpu_accelerator(accelerator)
    if on_tpu and isinstance(strategy, lightning_ddp) and not isinstance(strategy, torchtpu_ddp):
        raise ValueError(
            f"Lightning's {type(strategy).__name__} cannot run on accelerator 'tpu' (TorchTPU): it passes"
            f" device_ids and opens a CUDA stream. Pass strategy='ddp' by name (on 'tpu' it means {DDP_STRATEGY!r}),"
            f" strategy='auto', or an instance of {_PKG}.strategies.{torchtpu_ddp.__name__}."
        )
    if not on_tpu and isinstance(strategy, torchtpu_ddp):
        raise ValueError(
            f"Strategy {DDP_STRATEGY!r} runs on 'tpu' devices only, but the accelerator is"
            f" {type(accelerator).__name__}. Use accelerator='tpu'."
        )


@hookimpl
def trainer_plugins_launch_environment(
    accelerator: Any, strategy: Any, num_nodes: int, processes_per_node: int, started_externally: bool, api: str
) -> Optional[dict[str, str]]:
    """TorchTPU's job-wide variables (``TORCH_TPU_SLICEBUILDER_ADDRESSES``, ...), by torch-tpu's rule.

    See :func:`torchtpu_plugins.roles._launch_environment.for_run`; the core sets only those still unset.
    """
    if not _is_torchtpu_accelerator(accelerator):
        return None
    from torchtpu_plugins.roles import _launch_environment

    return _launch_environment.for_run(num_nodes, processes_per_node, started_externally)


@hookimpl
def trainer_plugins_doctor() -> Optional[dict[str, Any]]:
    from torchtpu_plugins import _doctor

    return _doctor.describe()
