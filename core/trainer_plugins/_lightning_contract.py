"""The contract with Lightning's internals: every private Lightning name trainer-plugins relies on.

``trainer_plugins._lightning`` subclasses three private Lightning classes, overrides some of their
private methods and reads private attributes they set; ``trainer_plugins._attach`` replaces the
names ``trainer.py``/``fabric.py`` build connectors from. Public names are not listed. If a Lightning
release renames one of these, :func:`contract_violations` names it (``tests/test_lightning_contract.py``
runs it on every Lightning version of the tox matrix), and a Lightning version outside the tested
range is not attached to at all (see ``trainer_plugins._attach.unsupported``).

Nothing here imports Lightning until :func:`contract_violations` is called.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from importlib import import_module
from typing import NamedTuple

from trainer_plugins._standalone import path_in


class PrivateMethod(NamedTuple):
    """A private method we override or call: ``"module:Class.method"`` and its parameter names."""

    path: str
    parameters: tuple[str, ...]


class PrivateAttribute(NamedTuple):
    """A private attribute we read or replace: ``"module:Class"`` (or ``"module:"`` for a module) and its name.

    An instance attribute is checked by its assignment ``self.<name> =`` in the class's source, a
    class attribute by the class's own namespace.
    """

    path: str
    name: str


def lightning_release() -> tuple[int, ...]:
    """``(major, minor)`` of the installed Lightning (``lightning``, else ``pytorch-lightning``), from its metadata.

    For the names whose signature changed between the Lightning releases of the tested range.
    """
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    for distribution in ("lightning", "pytorch-lightning"):
        try:
            return Version(version(distribution)).release[:2]
        except PackageNotFoundError:
            continue
    return (0, 0)


_TRAINER = "lightning.pytorch.trainer.connectors.accelerator_connector:_AcceleratorConnector"
_FABRIC = "lightning.fabric.connector:_Connector"
_DATA = "lightning.pytorch.trainer.connectors.data_connector:_DataConnector"
_CHECKPOINT = "lightning.pytorch.trainer.connectors.checkpoint_connector:_CheckpointConnector"
_DECISIONS = (
    ("_choose_auto_accelerator", ()),  # a staticmethod in Lightning
    ("_set_parallel_devices_and_init_accelerator", ("self",)),
    ("_choose_and_init_cluster_environment", ("self",)),
    ("_choose_strategy", ("self",)),
    ("_check_strategy_and_fallback", ("self",)),
    ("_init_strategy", ("self",)),
    ("_check_and_init_precision", ("self",)),
    ("_lazy_init_strategy", ("self",)),
)

METHODS = (
    PrivateMethod(
        f"{_TRAINER}._check_config_and_set_final_flags",
        ("self", "strategy", "accelerator", "precision", "plugins", "sync_batchnorm"),
    ),
    PrivateMethod(
        f"{_FABRIC}._check_config_and_set_final_flags", ("self", "strategy", "accelerator", "precision", "plugins")
    ),
    *(PrivateMethod(f"{cls}.{name}", parameters) for cls in (_TRAINER, _FABRIC) for name, parameters in _DECISIONS),
    PrivateMethod(f"{_DATA}._prepare_dataloader", ("self", "dataloader", "shuffle", "mode")),
    PrivateMethod(f"{_CHECKPOINT}.dump_checkpoint", ("self", "weights_only")),
    PrivateMethod(
        f"{_CHECKPOINT}._parse_ckpt_path", ("self", "state_fn", "ckpt_path", "model_provided", "model_connected")
    ),
    PrivateMethod(
        f"{_CHECKPOINT}._restore_modules_and_callbacks",
        ("self", "checkpoint_path") + (("weights_only",) if lightning_release() >= (2, 6) else ()),
    ),
    PrivateMethod(f"{_CHECKPOINT}.restore_training_state", ("self",)),
    PrivateMethod(f"{_CHECKPOINT}.resume_end", ("self",)),
    PrivateMethod(
        "lightning.pytorch.callbacks.model_checkpoint:ModelCheckpoint._find_last_checkpoints", ("self", "trainer")
    ),
    PrivateMethod("lightning.pytorch.utilities.compile:_verify_strategy_supports_compile", ("model", "strategy")),
    PrivateMethod(
        f"{_DATA}.on_trainer_init",
        ("self", "val_check_interval", "reload_dataloaders_every_n_epochs", "check_val_every_n_epoch"),
    ),
    # trainer_plugins.long_runs: the Trainer function a launcher resolves `ckpt_path` for (2.6 added `weights_only`)
    PrivateMethod(
        "lightning.pytorch.trainer.trainer:Trainer._fit_impl",
        ("self", "model", "train_dataloaders", "val_dataloaders", "datamodule", "ckpt_path")
        + (("weights_only",) if lightning_release() >= (2, 6) else ()),
    ),
    PrivateMethod("lightning.pytorch.strategies.strategy:Strategy._configure_launcher", ("self",)),
    PrivateMethod("lightning.pytorch.loops.training_epoch_loop:_TrainingEpochLoop._should_accumulate", ("self",)),
    PrivateMethod("lightning.fabric.utilities.data:_set_sampler_epoch", ("dataloader", "epoch")),
    PrivateMethod("lightning.pytorch.plugins.io.async_plugin:AsyncCheckpointIO._ensure_setup", ("self",)),
)

_SHARED_FLAGS = (
    "_accelerator_flag",
    "_strategy_flag",
    "_parallel_devices",
    "_num_nodes_flag",
    "_cluster_environment_flag",
    "_devices_flag",
    "_registered_strategies",
)
ATTRIBUTES = (
    # the names the start-up hook replaces in Lightning's modules
    PrivateAttribute("lightning.pytorch.trainer.trainer:", "_AcceleratorConnector"),
    PrivateAttribute("lightning.pytorch.trainer.trainer:", "_DataConnector"),
    PrivateAttribute("lightning.fabric.fabric:", "_Connector"),
    PrivateAttribute("lightning.pytorch.trainer.trainer:", "_verify_strategy_supports_compile"),
    # instance attributes the adapter reads or sets
    *(PrivateAttribute(cls, name) for cls in (_TRAINER, _FABRIC) for name in _SHARED_FLAGS),
    PrivateAttribute(_TRAINER, "_accelerator_types"),
    PrivateAttribute(_TRAINER, "_precision_flag"),
    PrivateAttribute(_TRAINER, "_precision_plugin_flag"),
    PrivateAttribute(_FABRIC, "_registered_accelerators"),
    PrivateAttribute(_FABRIC, "_precision_input"),
    PrivateAttribute(_FABRIC, "_precision_instance"),
    PrivateAttribute("lightning.pytorch.trainer.trainer:Trainer", "_accelerator_connector"),
    PrivateAttribute("lightning.pytorch.trainer.trainer:Trainer", "_checkpoint_connector"),
    PrivateAttribute(_CHECKPOINT.partition(":")[0] + ":", "_CheckpointConnector"),
    PrivateAttribute(_CHECKPOINT, "_loaded_checkpoint"),
    PrivateAttribute(_CHECKPOINT, "_ckpt_path"),
    PrivateAttribute("lightning.pytorch.callbacks.model_checkpoint:ModelCheckpoint", "_fs"),
    # trainer_plugins.long_runs: launchers, the stop flag, the stop checkpoint's dump, the background writer's
    # thread, the loader positions (a training loader finds its index among the fit's loaders)
    PrivateAttribute("lightning.pytorch.strategies.launchers.launcher:", "_Launcher"),
    PrivateAttribute("lightning.pytorch.strategies.launchers.subprocess_script:", "_SubprocessScriptLauncher"),
    PrivateAttribute("lightning.pytorch.strategies.strategy:Strategy", "_launcher"),
    PrivateAttribute("lightning.pytorch.trainer.trainer:Trainer", "_signal_connector"),
    PrivateAttribute("lightning.pytorch.trainer.connectors.signal_connector:_SignalConnector", "received_sigterm"),
    PrivateAttribute("lightning.pytorch.core.module:LightningModule", "_trainer"),
    PrivateAttribute("lightning.pytorch.plugins.io.async_plugin:AsyncCheckpointIO", "_executor"),
    PrivateAttribute("lightning.pytorch.plugins.io.async_plugin:AsyncCheckpointIO", "_error"),
    PrivateAttribute("lightning.pytorch.loops.fit_loop:_FitLoop", "_combined_loader"),
    PrivateAttribute("lightning.fabric.utilities.data:", "_set_sampler_epoch"),
    PrivateAttribute("lightning.fabric.utilities.types:", "_Stateful"),
    PrivateAttribute("lightning.fabric.utilities.types:", "_PATH"),
)


def _resolve(path: str) -> object:
    module_name, _, qualname = path.partition(":")
    obj: object = import_module(module_name)
    for part in filter(None, qualname.split(".")):
        obj = getattr(obj, part)
    return obj


def contract_violations(
    package: str = "lightning",
    methods: Sequence[PrivateMethod] = METHODS,
    attributes: Sequence[PrivateAttribute] = ATTRIBUTES,
) -> list[str]:
    """What of ``methods`` and ``attributes`` the installed Lightning ``package`` lacks or changed.

    Args:
        package: ``"lightning"`` or ``"pytorch_lightning"`` (``pytorch_lightning``/``lightning_fabric``).
        methods: the private methods to check, written against ``lightning``; default the core's
            own (:data:`METHODS`). A plugin that relies on private Lightning names lists them the
            same way and checks them with this function from its tests.
        attributes: the private attributes to check, likewise; default :data:`ATTRIBUTES`.

    Returns:
        One line per missing name or changed signature; empty when the contract holds.
    """
    problems = []
    for method in methods:
        path = path_in(method.path, package)
        try:
            found = tuple(inspect.signature(_resolve(path)).parameters)  # type: ignore[arg-type]
        except (ImportError, AttributeError) as error:
            problems.append(f"{path}: missing ({type(error).__name__}: {error})")
            continue
        if found != method.parameters:
            problems.append(f"{path}: parameters {found}, expected {method.parameters}")
    for attribute in attributes:
        path = path_in(attribute.path, package)
        try:
            owner = _resolve(path)
        except (ImportError, AttributeError) as error:
            problems.append(f"{path}: missing ({type(error).__name__}: {error})")
            continue
        if inspect.ismodule(owner):
            present = hasattr(owner, attribute.name)
        else:
            source = "".join(inspect.getsource(cls) for cls in inspect.getmro(owner) if cls.__module__ != "builtins")  # type: ignore[arg-type]
            assigned = f"self.{attribute.name} =" in source or f"self.{attribute.name}:" in source
            present = assigned or attribute.name in vars(owner)  # type: ignore[arg-type]
        if not present:
            problems.append(f"{path}: no attribute {attribute.name}")
    return problems
