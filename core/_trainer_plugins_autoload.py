"""Start-up hook of trainer-plugins, run by the ``trainer_plugins.pth`` file in site-packages.

At interpreter start it only *arms* an import hook; it imports nothing but ``os`` and ``sys`` (no
torch, no Lightning, no plugin). When the ``lightning`` package has finished importing (any
``import lightning...`` runs its ``__init__`` first, which loads Trainer and Fabric), the hook
:func:`attach` es: Trainer and Fabric then build the plugin-aware connectors of
:mod:`trainer_plugins._lightning`, which are imported on the first ``Trainer(...)``/``Fabric(...)``.
Set ``TRAINER_PLUGINS_AUTOLOAD=0`` to switch this off: the ``.pth`` line then does not even import
this module, so nothing of trainer-plugins is imported, runs or prints; ``trainer_plugins.install()``
attaches explicitly.

PYTEST_DONT_REWRITE: this module is imported at start-up, before pytest loads the conformance kit
of this distribution (``pytest11`` entry point), so pytest must not try to rewrite it.
"""

import os
import sys

AUTOLOAD_VARIABLE = "TRAINER_PLUGINS_AUTOLOAD"
#: The package after whose import the hook attaches (its ``__init__`` imports Trainer and Fabric).
WATCHED_MODULE = "lightning"
#: (Lightning module, the class name it builds a connector from, our replacement in trainer_plugins._lightning).
TARGETS = (
    ("lightning.pytorch.trainer.trainer", "_AcceleratorConnector", "TrainerConnector"),
    ("lightning.pytorch.trainer.trainer", "_DataConnector", "TrainerDataConnector"),
    ("lightning.fabric.fabric", "_Connector", "FabricConnector"),
)
_originals: dict = {}

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
    """A ``sys.meta_path`` finder that attaches trainer-plugins right after ``lightning`` executes."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != WATCHED_MODULE:
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
        attach()

    loader.exec_module = exec_and_attach


def _connector_factory(class_name):
    """A stand-in for Lightning's connector class that builds ours, importing it on first use."""

    def build_connector(*args, **kwargs):
        from trainer_plugins import _lightning

        return getattr(_lightning, class_name)(*args, **kwargs)

    build_connector.trainer_plugins_connector = class_name  # type: ignore[attr-defined]
    return build_connector


def attach():
    """Point the imported Lightning Trainer/Fabric modules at the plugin-aware connectors (idempotent)."""
    for module_name, attribute, class_name in TARGETS:
        module = sys.modules.get(module_name)
        if module is None or _is_ours(getattr(module, attribute, None)):
            continue
        _originals[(module_name, attribute)] = getattr(module, attribute)
        setattr(module, attribute, _connector_factory(class_name))


def detach():
    """Give the Lightning modules back their own connector classes."""
    for (module_name, attribute), original in list(_originals.items()):
        setattr(sys.modules[module_name], attribute, original)
        del _originals[(module_name, attribute)]


def attached():
    """Whether every Lightning module of :data:`TARGETS` currently builds the plugin-aware connectors."""
    return all(
        module_name in sys.modules and _is_ours(getattr(sys.modules[module_name], attribute, None))
        for module_name, attribute, _ in TARGETS
    )


def _is_ours(obj):
    return hasattr(obj, "trainer_plugins_connector")


def arm():
    """Install the import hook unless ``TRAINER_PLUGINS_AUTOLOAD`` switches it off (idempotent)."""
    try:
        enabled = autoload_enabled(os.environ.get(AUTOLOAD_VARIABLE))
    except ValueError as error:
        sys.stderr.write(f"trainer-plugins: {error}; automatic registration stays off\n")
        return
    if enabled and not any(_is_hook(finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, LightningImportHook())
