"""Lightning's two packagings: the same plugin classes built on ``lightning`` or on ``pytorch_lightning``.

Lightning ships its code twice: as the unified ``lightning`` package (``lightning.pytorch``,
``lightning.fabric``) and as the standalone ``pytorch_lightning`` and ``lightning_fabric`` packages,
which Lightning's build generates from the same source by renaming those two import roots. Classes
of one packaging are not instances of the other's base classes, and Lightning checks
``isinstance``, so a plugin's class written against ``lightning`` cannot serve
``pytorch_lightning.Trainer``.

This module builds the standalone twin of a module the same way Lightning builds its standalone
packages: from the one source, with ``lightning.pytorch``/``lightning.fabric`` imports renamed to
``pytorch_lightning``/``lightning_fabric``. The twin of module ``m`` is importable as
``trainer_plugins._standalone.m`` (so twins pickle into worker processes like any class). Only
modules that import Lightning, directly or through a module of their own package, get a twin; the
rest (``torch_xla`` probes, the plugin registry of ``trainer_plugins``) are shared, so there is one
plugin manager and one implementation of each role.
"""

from __future__ import annotations

import ast
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from pkgutil import resolve_name
from types import ModuleType
from typing import Any, Optional

#: The two packagings of Lightning: the unified one and the standalone one.
PACKAGES = ("lightning", "pytorch_lightning")
#: Import roots of the unified package and their standalone names (Lightning's own build renames these).
RENAMES = (("lightning.pytorch", "pytorch_lightning"), ("lightning.fabric", "lightning_fabric"))
#: Modules of ours that never get a twin (one registry per process), except the Lightning adapters.
_SHARED_ROOT = "trainer_plugins"
_ADAPTERS = frozenset(
    {
        "trainer_plugins._lightning",
        "trainer_plugins._lightning_checkpoint",
        "trainer_plugins._lightning_compile",
        "trainer_plugins._action_profiler",
        "trainer_plugins._goodput",
        "trainer_plugins.environments",
    }
)

__path__: list[str] = []  # a package for the import system: ``trainer_plugins._standalone.<module>`` are the twins


def _renamed(name: str) -> Optional[str]:
    for unified, standalone in RENAMES:
        if name == unified or name.startswith(unified + "."):
            return standalone + name[len(unified) :]
    return None


def standalone_name(name: str) -> str:
    """The module that plays the part of module ``name`` for ``pytorch_lightning``.

    ``lightning.pytorch.x`` -> ``pytorch_lightning.x``, ``lightning.fabric.x`` -> ``lightning_fabric.x``;
    a module that imports Lightning (directly or through its own package) -> its twin
    ``trainer_plugins._standalone.<name>``; any other module -> ``name`` itself (shared).
    """
    renamed = _renamed(name)
    if renamed is not None:
        return renamed
    return f"{__name__}.{name}" if _needs_twin(name) else name


def standalone_path(path: str) -> str:
    """:func:`standalone_name` for a ``"module:attribute"`` path (a class path of an entry)."""
    module, _, attribute = path.partition(":")
    return f"{standalone_name(module)}:{attribute}"


def path_in(path: str, package: str) -> str:
    """The ``"module:attribute"`` path of the object ``path`` names, for Lightning ``package`` (:data:`PACKAGES`).

    Raises:
        ValueError: ``package`` is not one of :data:`PACKAGES`.
    """
    if package not in PACKAGES:
        raise ValueError(f"package must be one of {PACKAGES}, got {package!r}")
    return path if package == "lightning" else standalone_path(path)


def resolve_in(path: str, package: str) -> Any:
    """Import and return the object at ``"module:attribute"`` for Lightning ``package`` (see :func:`path_in`)."""
    return resolve_name(path_in(path, package))


def package_of(obj: Any) -> str:
    """The Lightning packaging of ``obj`` (an instance or a class): ``"pytorch_lightning"`` or ``"lightning"``.

    Decided by the modules of its classes (MRO): a standalone package or a twin means
    ``"pytorch_lightning"``; anything else ``"lightning"``.
    """
    cls = obj if isinstance(obj, type) else type(obj)
    standalone = tuple(standalone for _, standalone in RENAMES) + (__name__,)
    for base in cls.__mro__:
        root = base.__module__.split(".")[0]
        if root in standalone or base.__module__.startswith(__name__ + "."):
            return "pytorch_lightning"
    return "lightning"


def package_of_module(name: str) -> str:
    """``"pytorch_lightning"`` for a twin module's ``__name__``, else ``"lightning"``."""
    return "pytorch_lightning" if name.startswith(__name__ + ".") else "lightning"


# --- which modules need a twin ----------------------------------------------------------------------


def _is_shared(name: str) -> bool:
    return (name == _SHARED_ROOT or name.startswith(_SHARED_ROOT + ".")) and name not in _ADAPTERS


def _source(name: str) -> Optional[tuple[str, str]]:
    """``(source, filename)`` of module ``name`` without executing it, or ``None``."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.loader is None or not isinstance(spec.loader, importlib.abc.InspectLoader):
        return None
    source = spec.loader.get_source(name)
    return None if source is None else (source, spec.origin or name)


def _package_of(name: str, is_package: bool) -> str:
    return name if is_package else name.rpartition(".")[0]


def _imported_modules(tree: ast.AST, package: str) -> set[str]:
    """Absolute names of the modules ``tree`` imports anywhere (``from m import x`` adds ``m`` and ``m.x``)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node, package)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names if alias.name != "*")
    return found


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    base = importlib.util.resolve_name("." * node.level, package) if package else ""
    return f"{base}.{node.module}" if node.module else base


@functools.cache
def _plugin_roots() -> frozenset[str]:
    """Top-level packages of the installed plugins (entry point group ``trainer_plugins``): what twins are made of."""
    from importlib.metadata import entry_points

    return frozenset(ep.value.split(":")[0].split(".")[0] for ep in entry_points(group="trainer_plugins"))


_twin_answers: dict[str, bool] = {}


def _needs_twin(name: str) -> bool:
    """Whether module ``name`` of a plugin (or our adapter) imports Lightning, directly or through its package.

    Only modules of installed plugins' packages and :data:`_ADAPTERS` are considered: everything else
    (torch, torch_xla, the standard library) is shared as it is.
    """
    root = name.split(".")[0]
    if name not in _ADAPTERS and (_is_shared(name) or root not in _plugin_roots()):
        return False
    if name not in _twin_answers:
        _twin_answers[name] = False  # an import cycle back to this module adds nothing
        found = _source(name)
        if found is not None:
            package = _package_of(name, found[1].endswith("__init__.py"))
            imported = _imported_modules(ast.parse(found[0]), package)
            _twin_answers[name] = any(
                _renamed(module) is not None
                or module == "lightning"
                or (module.split(".")[0] == root and module != name and _needs_twin(module))
                for module in imported
            )
    return _twin_answers[name]


# --- building a twin ----------------------------------------------------------------------------------


class _Renamer(ast.NodeTransformer):
    """Rewrites every import of a module's source to the standalone names (:func:`standalone_name`)."""

    def __init__(self, package: str) -> None:
        self.package = package

    def visit_Import(self, node: ast.Import) -> ast.Import:
        for alias in node.names:
            renamed = standalone_name(alias.name)
            if renamed != alias.name and alias.asname is not None:
                alias.name = renamed  # `import lightning.pytorch as pl`; a bare dotted import keeps its name
        return node

    def visit_ImportFrom(self, node: ast.ImportFrom) -> Any:
        module = _absolute(node, self.package)
        renamed = standalone_name(module)
        if renamed != module:
            return ast.copy_location(ast.ImportFrom(module=renamed, names=node.names, level=0), node)
        # `from package import submodule`: a submodule with a twin is imported from the package's twin
        twinned = [
            a for a in node.names if a.name != "*" and standalone_name(f"{module}.{a.name}") != f"{module}.{a.name}"
        ]
        if not twinned:
            node.module, node.level = module, 0
            return node
        rest = [alias for alias in node.names if alias not in twinned]
        nodes = [ast.ImportFrom(module=f"{__name__}.{module}", names=twinned, level=0)]
        if rest:
            nodes.append(ast.ImportFrom(module=module, names=rest, level=0))
        return [ast.copy_location(new, node) for new in nodes]


class _TwinFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and executes ``trainer_plugins._standalone.<module>``: ``<module>``'s source, imports renamed."""

    prefix = __name__ + "."

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]] = None, target: Optional[ModuleType] = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if not fullname.startswith(self.prefix):
            return None
        original = fullname[len(self.prefix) :]
        found = _source(original)
        if found is None:
            return None
        is_package = found[1].endswith("__init__.py")
        spec = importlib.machinery.ModuleSpec(fullname, self, origin=found[1], is_package=is_package)
        spec.has_location = True
        return spec

    def exec_module(self, module: ModuleType) -> None:
        original = module.__name__[len(self.prefix) :]
        found = _source(original)
        assert found is not None  # find_spec checked it
        source, filename = found
        is_package = filename.endswith("__init__.py")
        tree = _Renamer(_package_of(original, is_package)).visit(ast.parse(source, filename))
        ast.fix_missing_locations(tree)
        if is_package:
            module.__path__ = []
        module.__file__ = filename
        exec(compile(tree, filename, "exec"), module.__dict__)


def _install_finder() -> None:
    if not any(isinstance(finder, _TwinFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _TwinFinder())


_install_finder()
