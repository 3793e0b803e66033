"""Attaching to and detaching from ``lightning.Trainer`` and ``lightning.Fabric`` from code."""

from __future__ import annotations

import _trainer_plugins_autoload as _autoload


def install() -> None:
    """Make ``lightning.Trainer`` and ``lightning.Fabric`` ask the plugins (imports Lightning; idempotent).

    ``pytorch_lightning.Trainer`` and ``lightning_fabric.Fabric`` are attached too: now if imported,
    else when they are imported. This is what the start-up hook does automatically unless
    ``TRAINER_PLUGINS_AUTOLOAD=0``.

    Raises:
        ControlError: a control variable (``TRAINER_PLUGINS_*``) holds an unreadable value; nothing
            is attached, so Trainers built afterwards are Lightning's own.
    """
    from trainer_plugins._controls import Controls

    Controls.from_env()  # an unreadable control fails here, once, not in every Trainer
    import lightning  # noqa: F401 - loads the Trainer and Fabric modules

    _autoload.watch()
    _autoload.attach()


def uninstall() -> None:
    """Give every Lightning Trainer and Fabric back Lightning's own connectors (and stop watching imports)."""
    _autoload.unwatch()
    _autoload.detach()


def installed() -> bool:
    """Whether the imported Lightning packages' Trainer and Fabric build the plugin-aware connectors."""
    return bool(_autoload.attached())
