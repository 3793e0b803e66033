"""The pre-start environment of a run: job-wide variables a backend's workers need before any of them starts.

A backend plugin names them through ``trainer_plugins_launch_environment``; :func:`apply` sets each one
not set yet and never changes one that is (the user, the engine or a parent process set it). It is
applied once per ``Trainer``/``Fabric`` in every process, when Lightning's connector has built the
strategy (the end of ``_lazy_init_strategy``): before Lightning's launchers start any worker (they do
in ``fit``/``Fabric.launch``, and their workers inherit ``os.environ``), and, in a worker that torchrun,
Ray or a scheduler started without the variables, before its device or process group starts.
``trainer_plugins.explain`` never applies it (no run starts there).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from trainer_plugins._records import PluginRecord


@dataclass
class LaunchEnvironment:
    """What :func:`apply` did, per variable, and which plugin asked for it.

    Attributes:
        set: name -> value set now (it was unset).
        kept: name -> (the value already set, the value a plugin asked for), for values left as they were.
        plugins: name -> the label of the plugin that asked for it.
    """

    set: dict[str, str] = field(default_factory=dict)
    kept: dict[str, tuple[str, str]] = field(default_factory=dict)
    plugins: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        """One line for the run's explanation: what was set, and what was already set and kept."""
        parts = [f"set {', '.join(sorted(self.set))}"] if self.set else []
        if self.kept:
            parts.append(f"kept as set before {', '.join(sorted(self.kept))}")
        return "; ".join(parts)


def apply(
    answers: Iterable[tuple[PluginRecord, Mapping[str, str]]], environ: MutableMapping[str, Any]
) -> LaunchEnvironment:
    """Set in ``environ`` every variable of ``answers`` that ``environ`` does not hold yet.

    A variable set to the empty string counts as set (torch-tpu's rule, and the shell's). Where two
    plugins ask for one variable, the first plugin's value is set and the second's is kept aside.

    Args:
        answers: ``(plugin record, {name: value})`` pairs, as ``PluginManager.call_each`` returns them.
        environ: the environment to fill (``os.environ`` for a run).

    Returns:
        What was set and what was left as it was.
    """
    done = LaunchEnvironment()
    for record, variables in answers:
        for name, value in variables.items():
            if name in environ:
                if name not in done.set:
                    done.kept.setdefault(name, (environ[name], value))
                continue
            environ[name] = value
            done.set[name] = value
            done.plugins[name] = record.label
    return done
