"""Declarations: what a plugin says it provides, one entry per name, with its class imported lazily."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, ClassVar, Optional

from trainer_plugins._standalone import path_in, resolve_in

#: The Lightning flavours an entry can serve: ``lightning.Trainer`` and ``lightning.Fabric``.
APIS = ("trainer", "fabric")

#: The Lightning base class every declared class must subclass, per (role, api).
ROLE_BASES = {
    ("accelerator", "trainer"): "lightning.pytorch.accelerators:Accelerator",
    ("accelerator", "fabric"): "lightning.fabric.accelerators:Accelerator",
    ("strategy", "trainer"): "lightning.pytorch.strategies:Strategy",
    ("strategy", "fabric"): "lightning.fabric.strategies:Strategy",
    ("precision", "trainer"): "lightning.pytorch.plugins.precision:Precision",
    ("precision", "fabric"): "lightning.fabric.plugins.precision:Precision",
    ("environment", "trainer"): "lightning.fabric.plugins.environments:ClusterEnvironment",
    ("environment", "fabric"): "lightning.fabric.plugins.environments:ClusterEnvironment",
}

_NAME = re.compile(r"^[a-z0-9][a-z0-9_.\-]*$")
_CLASS_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


@dataclass(frozen=True)
class _Entry:
    """One name a plugin provides for a role, and the classes behind it.

    Args:
        name: the name users type (``Trainer(strategy=name)``); lower case, no spaces.
        trainer: ``"package.module:Class"`` of the ``lightning.Trainer`` flavour, or ``None``.
        fabric: ``"package.module:Class"`` of the ``lightning.Fabric`` flavour, or ``None``.
        description: one line shown by ``trainer-plugins list``.
        aliases: further names for the same entry.
        deprecated_aliases: legacy names; selecting one works and emits a ``DeprecationWarning``.
        override: take the name even if Lightning or another plugin has it (see ``docs/controls.md``).

    Raises:
        ValueError: a name or class path is malformed, or neither flavour is given.
    """

    role: ClassVar[str] = ""
    name: str
    _: KW_ONLY
    trainer: Optional[str] = None
    fabric: Optional[str] = None
    description: str = ""
    aliases: tuple[str, ...] = ()
    deprecated_aliases: tuple[str, ...] = ()
    override: bool = False

    def __post_init__(self) -> None:
        for name in self.names:
            if not isinstance(name, str) or not _NAME.match(name):
                raise ValueError(
                    f"{type(self).__name__}: invalid name {name!r}; use lower-case letters, digits, '_', '-' or '.'"
                )
        if self.trainer is None and self.fabric is None:
            raise ValueError(f"{type(self).__name__}({self.name!r}) names no class: give `trainer=` and/or `fabric=`")
        for path in (self.trainer, self.fabric):
            if path is not None and not _CLASS_PATH.match(path):
                raise ValueError(f"{type(self).__name__}({self.name!r}): class path {path!r} is not 'module:Class'")

    @property
    def names(self) -> tuple[str, ...]:
        """Every name this entry answers to: the name, its aliases and its deprecated aliases."""
        return (self.name, *self.aliases, *self.deprecated_aliases)

    def class_path(self, api: str) -> Optional[str]:
        """The ``"module:Class"`` path for ``api`` (``"trainer"`` or ``"fabric"``), or ``None``."""
        if api not in APIS:
            raise ValueError(f"api must be one of {APIS}, got {api!r}")
        return self.trainer if api == "trainer" else self.fabric

    def load(self, api: str, package: str = "lightning") -> type:
        """Import and return the class for ``api`` and Lightning ``package``.

        Args:
            api: ``"trainer"`` or ``"fabric"``.
            package: ``"lightning"`` (default) or ``"pytorch_lightning"``: the standalone packages get
                the class's twin built on ``pytorch_lightning``/``lightning_fabric``
                (:mod:`trainer_plugins._standalone`).

        Raises:
            LookupError: the entry has no class for this api.
            TypeError: the class does not subclass the Lightning base of its role (``ROLE_BASES``).
            ImportError: the class's module cannot be imported.
        """
        path = self.class_path(api)
        if path is None:
            raise LookupError(f"{self.role} {self.name!r} is not available for lightning.{api.capitalize()}")
        cls = resolve_in(path, package)
        base = resolve_in(ROLE_BASES[(self.role, api)], package)
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise TypeError(
                f"{self.role} {self.name!r}: {path} must be a subclass of {base.__module__}.{base.__name__}"
            )
        return cls

    def loaded_class(self, api: str, package: str = "lightning") -> Optional[type]:
        """The class for ``api`` and ``package`` if its module is already imported, else ``None`` (never imports)."""
        path = self.class_path(api)
        if path is None:
            return None
        path = path_in(path, package)
        module_name, _, qualname = path.partition(":")
        obj: Any = sys.modules.get(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part, None)
        return obj if isinstance(obj, type) else None


@dataclass(frozen=True)
class AcceleratorEntry(_Entry):
    """An accelerator a plugin provides.

    Args:
        auto_priority: rank when the user passes ``accelerator="auto"``: the available accelerator
            with the highest priority wins. ``None`` (default) means never chosen by ``"auto"``.
            Lightning's built-ins rank ``cuda``/``mps`` at 10 and ``cpu`` at 0.
    """

    role: ClassVar[str] = "accelerator"
    auto_priority: Optional[int] = None


@dataclass(frozen=True)
class StrategyEntry(_Entry):
    """A strategy a plugin provides.

    Args:
        distributed: whether the strategy runs one model replica per device across processes or
            devices. The connector's ``is_distributed`` answers ``True`` for it (the whitelist rule).
        init_kwargs: keyword arguments the class is built with when selected by this name
            (Lightning's ``StrategyRegistry.register(**init_params)``).
        supports_compile: whether the Trainer may run a ``torch.compile``d LightningModule on it.
            Lightning's own check (``_verify_strategy_supports_compile``) accepts only its
            ``SingleDeviceStrategy``, ``DDPStrategy`` and ``FSDPStrategy`` and their subclasses; a
            strategy declared here is accepted too.
    """

    role: ClassVar[str] = "strategy"
    distributed: bool = False
    init_kwargs: Mapping[str, Any] = field(default_factory=dict)
    supports_compile: bool = False


@dataclass(frozen=True)
class PrecisionEntry(_Entry):
    """A precision plugin a plugin provides.

    Args:
        precisions: the precision strings it handles (``"bf16-true"``, ...), for listings and docs.
    """

    role: ClassVar[str] = "precision"
    precisions: tuple[str, ...] = ()


@dataclass(frozen=True)
class EnvironmentEntry(_Entry):
    """A cluster environment a plugin provides."""

    role: ClassVar[str] = "environment"


ENTRY_TYPES: Mapping[str, type[_Entry]] = {
    cls.role: cls for cls in (AcceleratorEntry, StrategyEntry, PrecisionEntry, EnvironmentEntry)
}
