"""Start-up hook of trainer-plugins, run by the ``trainer_plugins.pth`` file in site-packages.

At interpreter start it only *arms* an import hook; it imports nothing but ``os`` and ``sys`` (no
torch, no Lightning, no plugin). When the ``lightning`` package has finished importing (any
``import lightning...`` runs its ``__init__`` first, which loads Trainer and Fabric), the hook calls
:func:`trainer_plugins.install`, which points Trainer and Fabric at the plugin-aware connectors.
Set ``TRAINER_PLUGINS_AUTOLOAD=0`` to switch this off; then call ``trainer_plugins.install()``
to attach explicitly.
"""

import os
import sys

AUTOLOAD_VARIABLE = "TRAINER_PLUGINS_AUTOLOAD"
#: The package after whose import the hook attaches (its ``__init__`` imports Trainer and Fabric).
WATCHED_MODULE = "lightning"

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
    """A ``sys.meta_path`` finder that attaches trainer-plugins right after ``lightning`` executes."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != WATCHED_MODULE:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None and spec.loader is not None:
                _attach_after_exec(spec.loader)
                return spec
        return None


def _attach_after_exec(loader):
    exec_module = loader.exec_module

    def exec_and_attach(module):
        exec_module(module)
        try:
            from trainer_plugins._lightning import install

            install()
        except Exception as error:  # never break `import lightning`
            import warnings

            warnings.warn(
                f"trainer-plugins could not attach to Lightning ({error!r}); Lightning runs without plugins."
                f" Set {AUTOLOAD_VARIABLE}=0 to silence this.",
                RuntimeWarning,
                stacklevel=2,
            )

    loader.exec_module = exec_and_attach


def arm():
    """Install the import hook unless ``TRAINER_PLUGINS_AUTOLOAD`` switches it off (idempotent)."""
    try:
        enabled = autoload_enabled(os.environ.get(AUTOLOAD_VARIABLE))
    except ValueError as error:
        sys.stderr.write(f"trainer-plugins: {error}; automatic registration stays off\n")
        return
    if enabled and not any(isinstance(finder, LightningImportHook) for finder in sys.meta_path):
        sys.meta_path.insert(0, LightningImportHook())
