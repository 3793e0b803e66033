"""Attaching to and detaching from ``lightning.Trainer`` and ``lightning.Fabric`` from code."""

from __future__ import annotations

import _trainer_plugins_autoload as _autoload


def install() -> None:
    """Make ``lightning.Trainer`` and ``lightning.Fabric`` ask the plugins (imports Lightning; idempotent).

    This is what the start-up hook does automatically unless ``TRAINER_PLUGINS_AUTOLOAD=0``.

    Raises:
        ControlError: a control variable (``TRAINER_PLUGINS_*``) holds an unreadable value; nothing
            is attached, so Trainers built afterwards are Lightning's own.
    """
    from trainer_plugins._controls import Controls

    Controls.from_env()  # an unreadable control fails here, once, not in every Trainer
    import lightning  # noqa: F401 - loads the Trainer and Fabric modules

    _autoload.attach()


def uninstall() -> None:
    """Give ``lightning.Trainer`` and ``lightning.Fabric`` back Lightning's own connectors."""
    _autoload.detach()


def installed() -> bool:
    """Whether both Trainer and Fabric currently build the plugin-aware connectors."""
    return bool(_autoload.attached())
