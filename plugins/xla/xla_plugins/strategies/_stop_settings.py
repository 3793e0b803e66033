"""The settings of the checkpoint a run writes when told to stop (:mod:`xla_plugins.strategies._preemption`).

Environment variables, read when a run starts (a bad value fails then, naming the variable, the
value and the choices), and the exit status of a stopped run.
"""

from __future__ import annotations

import os
import signal

from xla_plugins import _variables

#: Variable naming further signals (comma-separated, e.g. ``SIGUSR1,SIGUSR2``) that stop the run with a checkpoint.
SIGNALS_VARIABLE = "XLA_PLUGINS_CHECKPOINT_SIGNALS"
#: Variable setting the seconds from the signal by which the checkpoint must be written.
DEADLINE_VARIABLE = "XLA_PLUGINS_CHECKPOINT_DEADLINE"
#: Variable choosing whether ``fit`` without ``ckpt_path`` resumes from the stop checkpoint: ``off`` or ``auto``.
RESUME_VARIABLE = "XLA_PLUGINS_RESUME"
#: Seconds from the signal to the written checkpoint: below the 30 s notice of Spot / preemptible VMs.
DEFAULT_DEADLINE_S = 20.0
#: File name of the stop checkpoint in ``<default_root_dir>/checkpoints``; it starts with Lightning's
#: ``ModelCheckpoint.CHECKPOINT_NAME_LAST``, so a ``ModelCheckpoint`` writing to that folder counts it as "last".
FILENAME = "last-stopped.ckpt"
#: Signals that may be named in :data:`SIGNALS_VARIABLE` (SIGTERM always stops the run with a checkpoint).
SIGNAL_CHOICES = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGXCPU", "SIGALRM")
RESUME_CHOICES = ("off", "auto")


def checkpoint_signals() -> tuple[signal.Signals, ...]:
    """SIGTERM, then the signals named in :data:`SIGNALS_VARIABLE` (names as in :data:`SIGNAL_CHOICES`, any case,
    ``SIG`` optional), without repeats.

    Raises:
        ValueError: a name that is not one of :data:`SIGNAL_CHOICES`; the message names it and the choices.
    """
    text = os.environ.get(SIGNALS_VARIABLE, "")
    chosen = [signal.SIGTERM]
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name = item.upper() if item.upper().startswith("SIG") else "SIG" + item.upper()
        if name not in SIGNAL_CHOICES or not hasattr(signal, name):
            raise ValueError(
                f"{SIGNALS_VARIABLE}={text!r} names {item!r}, which is not a signal the run can stop on: give a"
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
        DEADLINE_VARIABLE, DEFAULT_DEADLINE_S, "the seconds from the stop signal by which the checkpoint is written"
    )


def resume_mode() -> str:
    """``"off"`` (default, also when empty) or ``"auto"``, from :data:`RESUME_VARIABLE`.

    Raises:
        ValueError: any other value; the message names it and the choices.
    """
    text = os.environ.get(RESUME_VARIABLE, "")
    mode = text.strip().lower() or "off"
    if mode not in RESUME_CHOICES:
        raise ValueError(f"{RESUME_VARIABLE}={text!r} is not valid: give one of {', '.join(RESUME_CHOICES)}.")
    return mode


def resume_hint() -> str:
    """How to resume from the stop checkpoint, for the stop message: a plain rerun where ``XLA_PLUGINS_RESUME=auto``
    is set already, else ``ckpt_path="last"`` or setting it (an invalid value reads as not set: the message
    must not fail; the next fit reports it)."""
    try:
        mode = resume_mode()
    except ValueError:
        mode = "off"
    if mode == "auto":
        return f"Run the same command again to resume ({RESUME_VARIABLE}=auto is set)."
    return f'Resume with trainer.fit(..., ckpt_path="last") or {RESUME_VARIABLE}=auto.'


def exit_status(signum: int) -> int:
    """The exit status of a run stopped by ``signum``: 128 + its number (143 for SIGTERM), the shell's convention."""
    return 128 + int(signum)
