"""trainer-plugins: hardware backends for PyTorch Lightning as separately installed plugins.

The public API lives here; everything else is private. Names are imported on first use, so
``import trainer_plugins`` costs almost nothing and imports neither torch nor Lightning.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "trainer_plugins._hookspecs": ("HOOKSPEC_VERSION", "hookimpl", "hookspec"),
    "trainer_plugins._entries": ("AcceleratorEntry", "EnvironmentEntry", "PrecisionEntry", "StrategyEntry"),
    "trainer_plugins._errors": ("PluginError", "PluginWarning"),
    "trainer_plugins._records": ("PluginRecord",),
    "trainer_plugins._manager": ("ENTRY_POINT_GROUP", "PluginManager"),
    "trainer_plugins._singleton": ("get_plugin_manager", "reset_plugin_manager"),
    "trainer_plugins._catalog": ("Catalog", "PluginConflictError", "get_catalog"),
    "trainer_plugins._controls": ("Controls", "configure"),
    "trainer_plugins._explanation": ("Decision", "Explanation"),
    "trainer_plugins._connector": ("Connector",),
    "trainer_plugins._lightning_checkpoint": ("CHECKPOINT_KEY", "PluginSetCheckpoint", "PluginSetCheckpointConnector"),
    "trainer_plugins._lightning": (
        "FabricConnector",
        "TrainerConnector",
        "TrainerDataConnector",
        "explain",
        "is_distributed",
    ),
    "trainer_plugins._versions": ("unsupported_versions",),
    "trainer_plugins._standalone": ("package_of", "resolve_in"),
    "trainer_plugins._action_profiler": (
        "ActionListener",
        "ActionProfiler",
        "action_listeners",
        "add_action_listener",
        "remove_action_listener",
        "runs_empty_hook",
    ),
    "trainer_plugins._goodput": ("GoodputLedger", "ledger_of", "start_ledger"),
    "trainer_plugins._goodput_ledger": ("Attempt", "RunLedger", "goodput_summary_line", "goodput_table_lines"),
    "trainer_plugins._goodput_record": ("read_ledger",),
    "trainer_plugins._install": ("install", "installed", "uninstall"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("trainer-plugins")
    if name not in _WHERE:
        raise AttributeError(f"module 'trainer_plugins' has no attribute {name!r}")
    return getattr(import_module(_WHERE[name]), name)


def __dir__() -> list[str]:
    return [*__all__, "__version__"]
