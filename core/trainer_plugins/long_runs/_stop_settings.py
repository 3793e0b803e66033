"""The settings of the checkpoint a run writes when told to stop (:mod:`trainer_plugins.long_runs._preemption`).

Environment variables, read when a run starts (a bad value fails then, naming the variable, the
value and the choices), and the exit status of a stopped run. Each setting has a neutral name
(``TRAINER_PLUGINS_*``, for every backend); a backend plugin whose users knew the settings under
its own prefix keeps those names working (:func:`accept_aliases`). The neutral name wins where both
are set (:func:`setting`).
"""

from __future__ import annotations

import os
import signal

from trainer_plugins import _variables

#: Variable naming further signals (comma-separated, e.g. ``SIGUSR1,SIGUSR2``) that stop the run with a checkpoint.
SIGNALS_VARIABLE = "TRAINER_PLUGINS_CHECKPOINT_SIGNALS"
#: Variable setting the seconds from the signal by which the checkpoint must be written.
DEADLINE_VARIABLE = "TRAINER_PLUGINS_CHECKPOINT_DEADLINE"
#: Variable choosing whether ``fit`` without ``ckpt_path`` resumes from the stop checkpoint: ``off`` or ``auto``.
RESUME_VARIABLE = "TRAINER_PLUGINS_RESUME"
_PREFIX = "TRAINER_PLUGINS"
#: Other names of the variables above, accepted where the neutral name is not set (:func:`accept_aliases`).
ALIASES: dict[str, list[str]] = {SIGNALS_VARIABLE: [], DEADLINE_VARIABLE: [], RESUME_VARIABLE: []}
#: Seconds from the signal to the written checkpoint: below the 30 s notice of Spot / preemptible VMs.
DEFAULT_DEADLINE_S = 20.0
#: File name of the stop checkpoint in ``<default_root_dir>/checkpoints``; it starts with Lightning's
#: ``ModelCheckpoint.CHECKPOINT_NAME_LAST``, so a ``ModelCheckpoint`` writing to that folder counts it as "last".
FILENAME = "last-stopped.ckpt"
#: Signals that may be named in :data:`SIGNALS_VARIABLE` (SIGTERM always stops the run with a checkpoint).
SIGNAL_CHOICES = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGXCPU", "SIGALRM")
RESUME_CHOICES = ("off", "auto")


def accept_aliases(prefix: str) -> None:
    """Accept ``<prefix>_CHECKPOINT_SIGNALS``, ``<prefix>_CHECKPOINT_DEADLINE`` and ``<prefix>_RESUME`` as well.

    For a backend plugin whose settings had its own prefix before they moved here; calling it again
    changes nothing.

    Args:
        prefix: upper-case letters, digits and underscores, e.g. ``"MY_BACKEND_PLUGINS"``.

    Raises:
        ValueError: ``prefix`` is empty or holds other characters.
    """
    if not prefix or not all(c.isupper() or c.isdigit() or c == "_" for c in prefix):
        raise ValueError(f"accept_aliases({prefix!r}): give a prefix of upper-case letters, digits and underscores.")
    for variable, aliases in ALIASES.items():
        alias = prefix + variable[len(_PREFIX) :]
        if alias not in aliases:
            aliases.append(alias)


def setting(variable: str) -> str:
    """The name under which ``variable`` (one of the names above) is set: itself, else the first alias that is set.

    Where none is set, ``variable``; a blank value counts as not set.
    """
    if os.environ.get(variable, "").strip():
        return variable
    return next((alias for alias in ALIASES[variable] if os.environ.get(alias, "").strip()), variable)


def checkpoint_signals() -> tuple[signal.Signals, ...]:
    """SIGTERM, then the signals named in :data:`SIGNALS_VARIABLE` (names as in :data:`SIGNAL_CHOICES`, any case,
    ``SIG`` optional), without repeats.

    Raises:
        ValueError: a name that is not one of :data:`SIGNAL_CHOICES`; the message names it and the choices.
    """
    variable = setting(SIGNALS_VARIABLE)
    text = os.environ.get(variable, "")
    chosen = [signal.SIGTERM]
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name = item.upper() if item.upper().startswith("SIG") else "SIG" + item.upper()
        if name not in SIGNAL_CHOICES or not hasattr(signal, name):
            raise ValueError(
                f"{variable}={text!r} names {item!r}, which is not a signal the run can stop on: give a"
                f" comma-separated list of {', '.join(SIGNAL_CHOICES)} (SIGTERM always stops it)."
            )
        if getattr(signal, name) not in chosen:
            chosen.append(getattr(signal, name))
    return tuple(chosen)


def deadline_s() -> float:
    """Seconds from the signal by which the checkpoint must be written (:data:`DEADLINE_VARIABLE`, default 20).

    Raises:
        ValueError: not a finite number >= 0 (the message names the value).
    """
    return _variables.seconds_from_environment(
        setting(DEADLINE_VARIABLE),
        DEFAULT_DEADLINE_S,
        "the seconds from the stop signal by which the checkpoint is written",
    )


def resume_mode() -> str:
    """``"off"`` (default, also when empty) or ``"auto"``, from :data:`RESUME_VARIABLE`.

    Raises:
        ValueError: any other value; the message names it and the choices.
    """
    return _variables.choice_from_environment(setting(RESUME_VARIABLE), RESUME_CHOICES, "off")


def resume_hint() -> str:
    """How to resume from the stop checkpoint, for the stop message.

    A plain rerun where ``TRAINER_PLUGINS_RESUME=auto`` (or an alias) is set already, else
    ``ckpt_path="last"`` or setting it, named as it is set (an invalid value reads as not set: the
    message must not fail; the next fit reports it)."""
    try:
        mode = resume_mode()
    except ValueError:
        mode = "off"
    variable = setting(RESUME_VARIABLE)
    if mode == "auto":
        return f"Run the same command again to resume ({variable}=auto is set)."
    return f'Resume with trainer.fit(..., ckpt_path="last") or {variable}=auto.'


def exit_status(signum: int) -> int:
    """The exit status of a run stopped by ``signum``: 128 + its number (143 for SIGTERM), the shell's convention."""
    return 128 + int(signum)
