"""Errors and warnings about plugins, and the wording that names the plugin at fault."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from trainer_plugins._records import PluginRecord

#: Exceptions a decision hook raises to reject the user's configuration; passed on unchanged.
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, TypeError, NotImplementedError, ModuleNotFoundError)


class PluginWarning(UserWarning):
    """Warning category for plugins that were quarantined or lost a name conflict."""


class PluginError(RuntimeError):
    """A plugin failed: it could not be imported, a hook or a class of it raised, or its API version does not match.

    The message names the plugin, its distribution and version and the original exception, which
    is also chained as ``__cause__``.

    Attributes:
        plugin: the :class:`PluginRecord` of the plugin at fault (``None`` if unknown).
        error: the original exception (``None`` if there was none).
    """

    plugin: Optional[PluginRecord] = None
    error: Optional[BaseException] = None


def plugin_error(message: str, record: PluginRecord, error: Optional[BaseException]) -> PluginError:
    """A :class:`PluginError` with ``message`` about ``record``'s plugin, keeping ``error`` (also as ``__cause__``)."""
    fault = PluginError(message)
    fault.plugin, fault.error = record, error
    fault.__cause__ = error
    return fault


class ProbeTimeout(TimeoutError):
    """A plugin's call did not answer within the probe timeout (``TRAINER_PLUGINS_PROBE_TIMEOUT``)."""


def add_note(error: BaseException, note: str) -> None:
    """Attach ``note`` to ``error``'s traceback (``BaseException.add_note``, Python >= 3.11)."""
    attach = getattr(error, "add_note", None)
    if attach is not None and note not in getattr(error, "__notes__", ()):
        attach(note)


def named(error: BaseException, record: PluginRecord) -> BaseException:
    """``error`` again, of the same type, with ``record``'s plugin named in front of its message.

    An exception whose constructor takes other arguments is returned as it is, with a note naming
    the plugin (:func:`add_note`).
    """
    prefix = f"plugin {record.label}: "
    if str(error).startswith(prefix) or (error.args and not isinstance(error.args[0], str)):
        return error
    try:
        renamed = type(error)(prefix + str(error))
    except Exception:  # a constructor with other arguments: keep the original, with a note
        add_note(error, f"raised by plugin {record.label}")
        return error
    if isinstance(error, ImportError):
        renamed.name, renamed.path = error.name, error.path  # type: ignore[attr-defined]
    return renamed
