"""The built-in plugin: Lightning's own accelerators, strategies, precisions and environments.

It also declares the environments of :mod:`trainer_plugins.environments` (:data:`HOST_ENVIRONMENTS`),
which read TPU VMs' and schedulers' variables.

It only *declares* Lightning's names (statically, so listing them imports nothing) so that plugins
cannot shadow them by accident; it makes no decisions. Where no plugin answers, the connector
falls back to Lightning's own rules. ``tests/test_builtin.py`` keeps this table equal to Lightning's
registries.
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Optional, TypedDict

from trainer_plugins._entries import AcceleratorEntry, EnvironmentEntry, PrecisionEntry, StrategyEntry
from trainer_plugins._hookspecs import hookimpl

TRAINER_PLUGINS_API = ">=1.0,<2"

_PL, _FAB = "lightning.pytorch", "lightning.fabric"


def installed_version(distribution: str) -> Optional[str]:
    """The installed version of ``distribution`` from its metadata (no import), or ``None``."""
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def lightning_version() -> Optional[str]:
    """The installed ``lightning`` distribution's version (from metadata, without importing it)."""
    return installed_version("lightning")


class _Paths(TypedDict):
    trainer: str
    fabric: str


def _both(module: str, cls: str) -> _Paths:
    """The same class name in ``lightning.pytorch.<module>`` (Trainer) and ``lightning.fabric.<module>``."""
    return {"trainer": f"{_PL}.{module}:{cls}", "fabric": f"{_FAB}.{module}:{cls}"}


#: Lightning's ``"auto"`` order: XLA (TPU), then MPS, then CUDA, then CPU.
ACCELERATORS = (
    AcceleratorEntry("cpu", **_both("accelerators", "CPUAccelerator"), auto_priority=0),
    AcceleratorEntry("cuda", **_both("accelerators", "CUDAAccelerator"), auto_priority=10),
    AcceleratorEntry("mps", **_both("accelerators", "MPSAccelerator"), auto_priority=20),
    AcceleratorEntry("tpu", **_both("accelerators", "XLAAccelerator"), auto_priority=30),
)

_DDP = _both("strategies", "DDPStrategy")
_DEEPSPEED = _both("strategies", "DeepSpeedStrategy")
_FSDP = _both("strategies", "FSDPStrategy")
_TRAINER_ONLY = ("ddp_find_unused_parameters_false",) + tuple(
    f"ddp_{kind}_find_unused_parameters_{flag}" for kind in ("spawn", "fork", "notebook") for flag in ("false", "true")
)
STRATEGIES = (
    *(StrategyEntry(name, **_DDP, distributed=True) for name in ("ddp", "ddp_spawn", "ddp_fork", "ddp_notebook")),
    StrategyEntry("ddp_find_unused_parameters_true", **_DDP, distributed=True),
    *(StrategyEntry(name, trainer=_DDP["trainer"], distributed=True) for name in _TRAINER_ONLY),
    StrategyEntry("dp", fabric=f"{_FAB}.strategies:DataParallelStrategy"),
    *(
        StrategyEntry(name, **_DEEPSPEED, distributed=True)
        for name in ("deepspeed", "deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_2_offload")
    ),
    StrategyEntry("deepspeed_stage_1_offload", fabric=_DEEPSPEED["fabric"], distributed=True),
    *(
        StrategyEntry(name, **_DEEPSPEED, distributed=True)
        for name in ("deepspeed_stage_3", "deepspeed_stage_3_offload", "deepspeed_stage_3_offload_nvme")
    ),
    StrategyEntry("fsdp", **_FSDP, distributed=True),
    StrategyEntry("fsdp_cpu_offload", **_FSDP, distributed=True),
    StrategyEntry("single_device", trainer=f"{_PL}.strategies:SingleDeviceStrategy"),
    StrategyEntry("single_xla", **_both("strategies", "SingleDeviceXLAStrategy"), deprecated_aliases=("single_tpu",)),
    StrategyEntry("xla", **_both("strategies", "XLAStrategy"), distributed=True),
    StrategyEntry("xla_debug", trainer=f"{_PL}.strategies:XLAStrategy", distributed=True),
    StrategyEntry("xla_fsdp", fabric=f"{_FAB}.strategies:XLAFSDPStrategy", distributed=True),
)

#: Lightning's whitelist of distributed strategy classes (its connector's ``is_distributed``).
#: The connector's rule (``Connector.is_distributed``): an instance of one of these, or of a strategy
#: a plugin declared ``distributed=True``, is distributed; otherwise the strategy's own
#: ``is_distributed`` answers (a property or value is read, a method is called, the answer must be a
#: ``bool``, and an exception it raises, ``AttributeError`` included, propagates); otherwise ``False``.
#: docs/migration-is-distributed.md states the same rule for users.
DISTRIBUTED_STRATEGIES = {
    api: tuple(
        f"{root}.strategies:{cls}"
        for cls in ("DDPStrategy", "FSDPStrategy", "DeepSpeedStrategy", "ModelParallelStrategy", "XLAStrategy")
    )
    for api, root in (("trainer", _PL), ("fabric", _FAB))
}

PRECISIONS = (
    PrecisionEntry("precision", **_both("plugins.precision", "Precision"), precisions=("32-true",)),
    PrecisionEntry("double", **_both("plugins.precision", "DoublePrecision"), precisions=("64-true",)),
    PrecisionEntry("half", **_both("plugins.precision", "HalfPrecision"), precisions=("16-true", "bf16-true")),
    PrecisionEntry(
        "mixed",
        trainer=f"{_PL}.plugins.precision:MixedPrecision",
        fabric=f"{_FAB}.plugins.precision:MixedPrecision",
        precisions=("16-mixed", "bf16-mixed"),
    ),
    PrecisionEntry("xla", **_both("plugins.precision", "XLAPrecision"), precisions=("32-true", "16-true", "bf16-true")),
    PrecisionEntry(
        "transformer_engine",
        **_both("plugins.precision", "TransformerEnginePrecision"),
        precisions=("transformer-engine", "transformer-engine-float16"),
    ),
)


def _environments(module: str, *names: tuple[str, str]) -> tuple[EnvironmentEntry, ...]:
    """Entries for the environment classes of ``module`` (name, class), the same class for both apis."""
    return tuple(EnvironmentEntry(name, trainer=f"{module}:{cls}", fabric=f"{module}:{cls}") for name, cls in names)


ENVIRONMENTS = _environments(
    "lightning.fabric.plugins.environments",
    ("lightning", "LightningEnvironment"),
    ("torchelastic", "TorchElasticEnvironment"),
    ("slurm", "SLURMEnvironment"),
    ("lsf", "LSFEnvironment"),
    ("mpi", "MPIEnvironment"),
    ("kubeflow", "KubeflowEnvironment"),
    ("xla", "XLAEnvironment"),
)

#: The environments read from TPU VMs' and schedulers' variables (:mod:`trainer_plugins.environments`),
#: in the order the connector detects them: after Lightning's launchers, before the accelerator's plugin.
HOST_ENVIRONMENTS = _environments(
    "trainer_plugins.environments",
    ("tpu_vm", "TPUVMEnvironment"),
    ("indexed_job", "IndexedJobEnvironment"),
    ("skypilot", "SkyPilotEnvironment"),
)


@hookimpl
def trainer_plugins_accelerators() -> tuple[AcceleratorEntry, ...]:
    return ACCELERATORS


@hookimpl
def trainer_plugins_strategies() -> tuple[StrategyEntry, ...]:
    return STRATEGIES


@hookimpl
def trainer_plugins_precisions() -> tuple[PrecisionEntry, ...]:
    return PRECISIONS


@hookimpl
def trainer_plugins_environments() -> tuple[EnvironmentEntry, ...]:
    return ENVIRONMENTS + HOST_ENVIRONMENTS


@hookimpl
def trainer_plugins_doctor() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "lightning": installed_version("lightning") or "not installed",
        "torch": installed_version("torch") or "not installed",
        "trainer-plugins": installed_version("trainer-plugins") or "not installed",
    }
