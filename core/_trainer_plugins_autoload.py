"""Start-up hook of trainer-plugins, run by the ``trainer_plugins.pth`` file in site-packages.

At interpreter start it only *arms* an import hook; it imports nothing but ``os`` and ``sys`` (no
torch, no Lightning, no plugin). When the ``lightning`` package has finished importing (any
``import lightning...`` runs its ``__init__`` first, which loads Trainer and Fabric), the hook calls
:func:`trainer_plugins._attach.attach`: Trainer and Fabric then build the plugin-aware connectors
of :mod:`trainer_plugins._lightning`, which are imported on the first ``Trainer(...)``/``Fabric(...)``.
This module holds only what runs before that: every Python process reads it, and where no bytecode
of it can be cached (``PYTHONDONTWRITEBYTECODE=1``, a read-only site-packages, an installer that
does not compile) every process compiles it again.
Set ``TRAINER_PLUGINS_AUTOLOAD=0`` to switch this off: the ``.pth`` line then does not even import
this module, so nothing of trainer-plugins is imported, runs or prints; ``trainer_plugins.install()``
attaches explicitly.

PYTEST_DONT_REWRITE: this module is imported at start-up, before pytest loads the conformance kit
of this distribution (``pytest11`` entry point), so pytest must not try to rewrite it.
"""

import os
import sys

AUTOLOAD_VARIABLE = "TRAINER_PLUGINS_AUTOLOAD"
#: The packages after whose import the hook attaches: the unified ``lightning`` (its ``__init__``
#: imports Trainer and Fabric) and the standalone ``pytorch_lightning`` and ``lightning_fabric``.
WATCHED_MODULES = ("lightning", "pytorch_lightning", "lightning_fabric")

#: The off words; ``trainer_plugins.pth`` repeats them (it must decide before importing anything).
_OFF = frozenset({"0", "false", "no", "off"})
_ON = frozenset({"", "1", "true", "yes", "on"})


def autoload_enabled(value):
    """Parse the value of ``TRAINER_PLUGINS_AUTOLOAD`` (``None`` when unset): ``True`` unless off.

    Raises:
        ValueError: the value is not one of 1/true/yes/on or 0/false/no/off (case-insensitive).
    """
    if value is None:
        return True
    word = value.strip().lower()
    if word in _OFF:
        return False
    if word in _ON:
        return True
    raise ValueError(f"{AUTOLOAD_VARIABLE}={value!r} is not understood; use 1/true/yes/on or 0/false/no/off")


class LightningImportHook:
    """A ``sys.meta_path`` finder that attaches trainer-plugins right after a Lightning package executes."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in WATCHED_MODULES:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if _is_hook(finder) or find is None:  # any copy of this hook, even from a reloaded module
                continue
            spec = find(fullname, path, target)
            if spec is not None and spec.loader is not None:
                _attach_after_exec(spec.loader)
                return spec
        return None


def _is_hook(finder):
    return type(finder).__name__ == LightningImportHook.__name__


def _attach_after_exec(loader):
    exec_module = loader.exec_module

    def exec_and_attach(module):
        exec_module(module)
        from trainer_plugins._attach import attach

        attach()

    loader.exec_module = exec_and_attach


class NoticeOnLightningImport:
    """A ``sys.meta_path`` finder that says, once, why the plugins are off when Lightning is first imported.

    Armed instead of the import hook when ``TRAINER_PLUGINS_AUTOLOAD`` holds an unreadable value, so
    that the notice reaches the scripts it concerns (those importing Lightning) and not every Python
    process (pip, the ``trainer-plugins`` command, which reports the value itself). It finds nothing
    and removes itself after speaking.
    """

    def __init__(self, notice):
        self.notice = notice

    def find_spec(self, fullname, path=None, target=None):
        if fullname in WATCHED_MODULES:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            sys.stderr.write(self.notice)
        return None


def arm():
    """Install the import hook unless ``TRAINER_PLUGINS_AUTOLOAD`` switches it off (idempotent).

    An unreadable value leaves the hook off; the first import of a Lightning package then says why,
    on one line of stderr (see :class:`NoticeOnLightningImport`).
    """
    try:
        enabled = autoload_enabled(os.environ.get(AUTOLOAD_VARIABLE))
    except ValueError as error:
        if not any(type(finder).__name__ == NoticeOnLightningImport.__name__ for finder in sys.meta_path):
            notice = f"trainer-plugins: {error}; automatic registration stays off\n"
            sys.meta_path.insert(0, NoticeOnLightningImport(notice))
        return
    if enabled:
        watch()


def watch():
    """Install the import hook, whatever ``TRAINER_PLUGINS_AUTOLOAD`` says (idempotent)."""
    if not any(_is_hook(finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, LightningImportHook())


def unwatch():
    """Remove the import hook: Lightning packages imported from now on keep their own connectors."""
    sys.meta_path[:] = [finder for finder in sys.meta_path if not _is_hook(finder)]
