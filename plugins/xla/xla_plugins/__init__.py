"""xla-plugins: the XLA (torch_xla / PJRT) backend of trainer-plugins.

After ``pip install xla-plugins``, ``lightning.Trainer(accelerator="tpu" | "xla", ...)`` uses the
classes below without any import in user code. They are exported here, whichever folder of the
package holds them, for people who build them explicitly or name them (the warnings and errors a run
may raise, to filter or catch); each is imported on first access, so importing this package imports
neither torch, Lightning nor torch_xla.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "xla_plugins.roles.accelerator": ("TPUAccelerator", "XLAAccelerator"),
    "xla_plugins.roles.environment": ("XLAEnvironment",),
    "xla_plugins.roles.precision": (
        "FabricXLAPrecision",
        "TPUBf16PrecisionPlugin",
        "TPUPrecisionPlugin",
        "XLAPrecision",
    ),
    "xla_plugins.strategies.single_xla": (
        "FabricSingleDeviceXLAStrategy",
        "SingleDeviceXLAStrategy",
        "SingleTPUStrategy",
    ),
    "xla_plugins.strategies.xla": ("FabricXLAStrategy", "XLAStrategy"),
    "xla_plugins.strategies.xla_spmd": ("FabricXLASPMDStrategy", "XLASPMDStrategy"),
    "xla_plugins.strategies.xla_fsdp_v2": ("FabricXLAFSDPv2Strategy", "XLAFSDPv2Strategy"),
    "xla_plugins.strategies.launchers": (
        "FabricXLALauncher",
        "ReplicaHangError",
        "WorkerDiedError",
        "WorkerTraceback",
        "XLALauncher",
    ),
    "xla_plugins.checkpoints.checkpoint_io": ("AtomicXLACheckpointIO", "BackgroundXLACheckpointIO"),
    "xla_plugins.compilation.compile_monitor": ("CompileMonitor",),
    "xla_plugins.compilation.recompile_budget": ("LateCompilationError", "LateCompilationWarning"),
    "xla_plugins.compilation.compile_cache": ("CompileCacheWarning",),
    "xla_plugins.loop.progress": ("XLAProgressBar",),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("xla-plugins")
    if name not in _WHERE:
        raise AttributeError(f"module 'xla_plugins' has no attribute {name!r}")
    return getattr(import_module(_WHERE[name]), name)


def __dir__() -> list[str]:
    return [*__all__, "__version__"]
