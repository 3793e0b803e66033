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
#: The packages after whose import the hook attaches: the unified ``lightning`` (its ``__init__``
#: imports Trainer and Fabric) and the standalone ``pytorch_lightning`` and ``lightning_fabric``.
WATCHED_MODULES = ("lightning", "pytorch_lightning", "lightning_fabric")
#: The module serving each Lightning packaging: ours, and its twin built on the standalone packages.
ADAPTERS = {
    "lightning": "trainer_plugins._lightning",
    "pytorch_lightning": "trainer_plugins._standalone.trainer_plugins._lightning",
}
#: (packaging, Lightning module, the class name it builds a connector from, our replacement in the adapter).
TARGETS = (
    ("lightning", "lightning.pytorch.trainer.trainer", "_AcceleratorConnector", "TrainerConnector"),
    ("lightning", "lightning.pytorch.trainer.trainer", "_DataConnector", "TrainerDataConnector"),
    ("lightning", "lightning.fabric.fabric", "_Connector", "FabricConnector"),
    ("pytorch_lightning", "pytorch_lightning.trainer.trainer", "_AcceleratorConnector", "TrainerConnector"),
    ("pytorch_lightning", "pytorch_lightning.trainer.trainer", "_DataConnector", "TrainerDataConnector"),
    ("pytorch_lightning", "lightning_fabric.fabric", "_Connector", "FabricConnector"),
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
        attach()

    loader.exec_module = exec_and_attach


def _connector_factory(package, class_name):
    """A stand-in for Lightning's connector class that builds ours, importing it on first use."""

    def build_connector(*args, **kwargs):
        from importlib import import_module

        return getattr(import_module(ADAPTERS[package]), class_name)(*args, **kwargs)

    build_connector.trainer_plugins_connector = class_name  # type: ignore[attr-defined]
    return build_connector


#: The distribution of each Lightning packaging (its version decides whether we attach).
DISTRIBUTIONS = {"lightning": "lightning", "pytorch_lightning": "pytorch-lightning"}
_warned: set = set()


def _lightning_version(package):
    """The installed version of Lightning ``package`` (from metadata), or ``None``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTIONS[package])
    except PackageNotFoundError:
        return None


def unsupported(package):
    """Why trainer-plugins cannot attach to the installed Lightning ``package``, or ``None`` when it can.

    The tested range is trainer-plugins' own requirement on ``lightning`` (its ``pyproject.toml``); the
    private names it relies on (``trainer_plugins._lightning_contract``) are checked in that range.
    """
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement

    installed = _lightning_version(package)
    try:
        declared = [Requirement(line) for line in requires("trainer-plugins") or []]
    except PackageNotFoundError:
        return None
    for requirement in declared:
        if requirement.name == "lightning" and installed is not None:
            if not requirement.specifier.contains(installed, prereleases=True):
                return (
                    f"trainer-plugins is tested with {DISTRIBUTIONS[package]}{requirement.specifier}, but"
                    f" {DISTRIBUTIONS[package]} {installed} is installed"
                )
    return None


def _gate_factory(package, original, problem):
    """Lightning's own connector class, with an error that says why a plugin's name is unknown to it."""

    def build_connector(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        except ValueError as error:
            for role in ("strategy", "accelerator"):
                flag = kwargs.get(role)
                if isinstance(flag, str) and str(error).startswith(f"You selected an invalid {role} name"):
                    from trainer_plugins import get_catalog

                    claim = get_catalog().find(role, flag.lower())
                    if claim is not None and not claim.builtin:
                        raise ValueError(
                            f"{error} The {role} {flag!r} comes from plugin {claim.plugin.label}, which cannot attach"
                            f" to this Lightning version: {problem}."
                        ) from error
            raise

    build_connector.trainer_plugins_connector = None  # type: ignore[attr-defined]  # ours, but not plugin-aware
    return build_connector


def attach():
    """Point the imported Lightning Trainer/Fabric modules at the plugin-aware connectors (idempotent).

    A Lightning version outside the tested range is left alone: one ``RuntimeWarning`` says so, and
    selecting a plugin's name fails with Lightning's error plus the reason.
    """
    for package, module_name, attribute, class_name in TARGETS:
        module = sys.modules.get(module_name)
        original = getattr(module, attribute, None)
        if original is None or _is_ours(original):  # not imported, still importing, or attached
            continue
        problem = unsupported(package)
        if problem is None:
            replacement = _connector_factory(package, class_name)
        elif class_name == "TrainerDataConnector":
            continue
        else:
            replacement = _gate_factory(package, original, problem)
            if package not in _warned:
                _warned.add(package)
                import warnings

                warnings.warn(
                    f"{problem}: trainer-plugins leaves {package} alone, so no plugin is used. Install a tested"
                    " version to use the plugins.",
                    RuntimeWarning,
                    stacklevel=2,
                )
        _originals[(module_name, attribute)] = original
        setattr(module, attribute, replacement)


def detach():
    """Give the Lightning modules back their own connector classes."""
    for (module_name, attribute), original in list(_originals.items()):
        setattr(sys.modules[module_name], attribute, original)
        del _originals[(module_name, attribute)]


def attached():
    """Whether every imported Lightning module of :data:`TARGETS` builds the plugin-aware connectors.

    ``False`` while no Lightning Trainer or Fabric module is imported.
    """
    imported = [(name, attribute) for _, name, attribute, _ in TARGETS if name in sys.modules]
    return bool(imported) and all(
        getattr(getattr(sys.modules[name], attribute, None), "trainer_plugins_connector", None) is not None
        for name, attribute in imported
    )


def _is_ours(obj):
    return hasattr(obj, "trainer_plugins_connector")


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
