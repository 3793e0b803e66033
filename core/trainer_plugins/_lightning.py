"""The one place where trainer-plugins adapts Lightning: the connector classes of Trainer and Fabric.

``lightning.Trainer`` builds its accelerator, strategy, precision plugin and cluster environment in
``_AcceleratorConnector``; ``lightning.Fabric`` in ``_Connector``. Both run the same sequence of
private methods (unchanged from Lightning 2.0 to 2.6). :class:`TrainerConnector` and
:class:`FabricConnector` subclass them and override only the *decision* methods: each asks the
plugins through :class:`~trainer_plugins._connector.Connector` first and falls back to Lightning's
own method when no plugin answers. :func:`trainer_plugins.install` (or the start-up hook) makes
``trainer.py``/``fabric.py`` build the subclasses instead; nothing else in Lightning is touched.
For ``pytorch_lightning``/``lightning_fabric`` the same source runs as its twin
(:mod:`trainer_plugins._standalone`).
"""

from __future__ import annotations

import contextvars
import logging
from typing import Any, ClassVar

from lightning.fabric.connector import _Connector
from lightning.fabric.plugins.environments import ClusterEnvironment
from lightning.fabric.utilities.rank_zero import rank_zero_info, rank_zero_only
from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector
from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector
from lightning.pytorch.trainer.connectors.data_connector import _DataConnector
from lightning.pytorch.trainer.states import RunningStage
from torch.utils.data import BatchSampler

from trainer_plugins._connector import Connector
from trainer_plugins._explanation import LIGHTNING_RULE
from trainer_plugins._lightning_checkpoint import PluginSetCheckpointConnector
from trainer_plugins._names import (
    canonical,
    check_name,
    extend_name_error,
    plugin_claim,
    strategies_of_accelerator_plugin,
    valid_names,
)
from trainer_plugins._records import BUILTIN_PLUGIN
from trainer_plugins._standalone import package_of_module
from trainer_plugins._versions import warn_unsupported_versions

#: The Lightning packaging this copy of the module adapts: this source serves ``lightning``; its twin
#: ``trainer_plugins._standalone.trainer_plugins._lightning`` (imports renamed) ``pytorch_lightning``.
PACKAGE = package_of_module(__name__)

warn_unsupported_versions("trainer-plugins", ["lightning"])

log = logging.getLogger("trainer_plugins")


class _PluginConnectorMixin:
    """Decision methods shared by both adapters; class attributes name Lightning's differing fields."""

    _api: ClassVar[str]
    _accelerator_names_attr: ClassVar[str]  # Lightning's list of valid accelerator names
    _precision_attr: ClassVar[str]  # Lightning's normalised precision string
    _precision_instance_attr: ClassVar[str]  # a Precision instance given through `plugins=`

    plugin_connector: Connector
    accelerator: Any
    strategy: Any
    _accelerator_flag: Any
    _strategy_flag: Any
    _parallel_devices: list[Any]
    _num_nodes_flag: int
    _registered_strategies: list[str]
    _cluster_environment_flag: Any
    _devices_flag: Any

    def _check_config_and_set_final_flags(
        self, strategy: Any, accelerator: Any, precision: Any, plugins: Any, **kwargs: Any
    ) -> None:
        connector = self.plugin_connector = Connector(self._api, package=PACKAGE)
        catalog, api = connector.catalog, self._api
        lightning_accelerators = getattr(self, self._accelerator_names_attr)
        lightning_strategies = self._registered_strategies
        check_name(catalog, api, "strategy", strategy, list(lightning_strategies))
        check_name(catalog, api, "accelerator", accelerator, list(lightning_accelerators))
        self._precision_as_given = precision
        # Lightning validates names against these lists (and words its own errors); plugin names pass
        # for the duration of the check only, as Lightning's later messages look names up in its registry.
        setattr(
            self, self._accelerator_names_attr, valid_names(catalog, api, "accelerator", list(lightning_accelerators))
        )
        self._registered_strategies = valid_names(catalog, api, "strategy", list(lightning_strategies))
        try:
            super()._check_config_and_set_final_flags(  # type: ignore[misc]
                strategy=canonical(catalog, "strategy", strategy),
                accelerator=canonical(catalog, "accelerator", accelerator),
                precision=precision,
                plugins=plugins,
                **kwargs,
            )
        except ValueError as error:
            text = str(error)
            for role, names in (("strategy", lightning_strategies), ("accelerator", lightning_accelerators)):
                if text.startswith(f"You selected an invalid {role} name"):
                    raise ValueError(extend_name_error(catalog, api, role, text, list(names))) from None
            raise
        finally:
            setattr(self, self._accelerator_names_attr, lightning_accelerators)
            self._registered_strategies = lightning_strategies

    def _check_strategy_and_fallback(self) -> None:
        # before Lightning's checks: they refuse "fsdp" on any accelerator but CUDA (Fabric: XLA's "tpu" too)
        self._strategy_flag = self.plugin_connector.strategy_for_name(self._strategy_flag, self.accelerator)
        try:
            super()._check_strategy_and_fallback()  # type: ignore[misc]
        except ValueError as error:
            hint = strategies_of_accelerator_plugin(self.plugin_connector.catalog, self._api, self.accelerator)
            if hint is None:
                raise
            raise ValueError(f"{error} {hint}") from error

    def _choose_auto_accelerator(self) -> str:
        return self.plugin_connector.choose_auto_accelerator()

    def _set_parallel_devices_and_init_accelerator(self) -> None:
        self._devices_as_given = self._devices_flag  # Lightning parses it in place below
        claim = plugin_claim(self.plugin_connector.catalog, "accelerator", self._accelerator_flag)
        given = self._accelerator_flag
        if claim is not None:
            self._accelerator_flag = self.plugin_connector.make_accelerator(claim)
        super()._set_parallel_devices_and_init_accelerator()  # type: ignore[misc]
        if claim is None:
            self._note_lightning_choice("accelerator", self.accelerator, given)
        self.plugin_connector.note(
            "devices",
            repr(self._parallel_devices),
            self._label_of("accelerator", self.accelerator),
            "accelerator.parse_devices",
        )

    def _choose_and_init_cluster_environment(self) -> Any:
        if not isinstance(self._cluster_environment_flag, ClusterEnvironment):
            environment = self.plugin_connector.choose_environment(self.accelerator)
            if environment is not None:
                return environment
        environment = super()._choose_and_init_cluster_environment()  # type: ignore[misc]
        self._note_lightning_choice("environment", environment, self._cluster_environment_flag)
        return environment

    def _choose_strategy(self) -> Any:
        choice = self.plugin_connector.choose_strategy(self.accelerator, self._parallel_devices, self._num_nodes_flag)
        if choice is None:
            choice = super()._choose_strategy()  # type: ignore[misc]
            self.plugin_connector.note("strategy", choice, BUILTIN_PLUGIN, LIGHTNING_RULE)
        return choice

    def _init_strategy(self) -> None:
        flag = self._strategy_flag
        strategy = self.plugin_connector.make_strategy(flag, self._parallel_devices) if isinstance(flag, str) else None
        if strategy is None:
            super()._init_strategy()  # type: ignore[misc]
            if not any(decision.role == "strategy" for decision in self.plugin_connector.explanation):
                self._note_lightning_choice("strategy", self.strategy, flag)
        else:
            self.strategy = strategy
        flags = {"strategy": flag, "devices": self._devices_as_given}
        self.plugin_connector.validate(self.accelerator, self.strategy, self._parallel_devices, flags)

    def _check_and_init_precision(self) -> Any:
        if getattr(self, self._precision_instance_attr) is None:
            plugin = self.plugin_connector.choose_precision(
                self.accelerator, self.strategy, getattr(self, self._precision_attr), self._precision_as_given
            )
            if plugin is not None:
                return plugin
        plugin = super()._check_and_init_precision()  # type: ignore[misc]
        self._note_lightning_choice("precision", plugin, getattr(self, self._precision_instance_attr))
        return plugin

    def _lazy_init_strategy(self) -> None:
        try:
            super()._lazy_init_strategy()  # type: ignore[misc]
        except ValueError as error:
            # Lightning's last check refuses strategy classes it does not know; their plugin may accept
            if not self.plugin_connector.accepts_lightning_refusal(error, self.accelerator, self.strategy):
                raise
        self.plugin_connector.explain_is_distributed(self.strategy)
        if not _EXPLAINING.get():
            self._apply_launch_environment()
        explanation = self.plugin_connector.explanation
        line = self.plugin_connector.startup_line()
        if line is not None and not _EXPLAINING.get():
            rank_zero_info(line)
        _log_table(explanation)

    def _apply_launch_environment(self) -> None:
        """The pre-start environment (:mod:`trainer_plugins._launch_environment`), before a launcher starts workers."""
        environment = getattr(self.strategy, "cluster_environment", None)
        self.plugin_connector.apply_launch_environment(
            self.accelerator,
            self.strategy,
            num_nodes=max(1, int(self._num_nodes_flag)),
            processes_per_node=max(1, len(self._parallel_devices)),
            started_externally=bool(environment is not None and environment.creates_processes_externally),
        )

    @property
    def is_distributed(self) -> bool:
        """The connector's answer (see :meth:`trainer_plugins.Connector.is_distributed`)."""
        return self.plugin_connector.is_distributed(self.strategy)

    # --- explanation helpers ---------------------------------------------------------------------

    def _label_of(self, role: str, obj: Any) -> str:
        claim = self.plugin_connector.catalog.owner_of(obj, role, self._api)
        return claim.plugin.label if claim is not None else BUILTIN_PLUGIN

    def _note_lightning_choice(self, role: str, obj: Any, given: Any) -> None:
        reason = "instance given by the user" if not isinstance(given, (str, type(None))) else LIGHTNING_RULE
        choice = self.plugin_connector.describe_as(role, obj, given if isinstance(given, str) else None)
        self.plugin_connector.note(role, choice, self._label_of(role, obj), reason)


#: Set while :func:`explain` resolves flags: no run starts, so no start-up line is logged.
_EXPLAINING: contextvars.ContextVar[bool] = contextvars.ContextVar("trainer_plugins_explaining", default=False)


@rank_zero_only
def _log_table(explanation: Any) -> None:
    """The full decision table, at DEBUG level of the ``trainer_plugins`` logger (rank 0 only)."""
    log.debug("trainer-plugins resolved the run:\n%s", explanation)


class TrainerConnector(_PluginConnectorMixin, _AcceleratorConnector):  # type: ignore[misc]
    """``lightning.Trainer``'s connector, asking the plugins before applying Lightning's rules."""

    _api = "trainer"
    _accelerator_names_attr = "_accelerator_types"
    _precision_attr = "_precision_flag"
    _precision_instance_attr = "_precision_plugin_flag"


class FabricConnector(_PluginConnectorMixin, _Connector):  # type: ignore[misc]
    """``lightning.Fabric``'s connector, asking the plugins before applying Lightning's rules."""

    _api = "fabric"
    _accelerator_names_attr = "_registered_accelerators"
    _precision_attr = "_precision_input"
    _precision_instance_attr = "_precision_instance"


class TrainerDataConnector(_DataConnector):
    """``lightning.Trainer``'s data connector: adds the checkpoint record, explains failed sampler injection.

    Lightning's ``Trainer.__init__`` initialises the data connector after the checkpoint connector,
    so this makes that one a :class:`PluginSetCheckpointConnector` there: the record comes only with
    the plugin-aware connectors (never through an entry point Lightning loads on its own, so
    ``TRAINER_PLUGINS_AUTOLOAD=0`` leaves it out).

    When the connector says a run is distributed, Lightning rebuilds each dataloader with a
    ``DistributedSampler``. A custom batch sampler it cannot rebuild makes Lightning raise a bare
    ``TypeError``; this names the batch sampler and the two ways out.
    """

    def on_trainer_init(self, *args: Any, **kwargs: Any) -> None:
        super().on_trainer_init(*args, **kwargs)
        checkpoints = self.trainer._checkpoint_connector  # type: ignore[attr-defined] # set by Lightning before
        if type(checkpoints) is _CheckpointConnector:
            checkpoints.__class__ = PluginSetCheckpointConnector

    def _prepare_dataloader(self, dataloader: object, shuffle: bool, mode: RunningStage) -> object:
        try:
            return super()._prepare_dataloader(dataloader, shuffle=shuffle, mode=mode)
        except TypeError as error:
            batch_sampler = getattr(dataloader, "batch_sampler", None)
            if batch_sampler is None or type(batch_sampler) is BatchSampler:
                raise
            raise TypeError(
                f"Cannot inject a DistributedSampler into the custom batch sampler {type(batch_sampler).__qualname__}"
                f" ({error}). Either let it be rebuilt (an `__init__(sampler, batch_size, drop_last)` like PyTorch's"
                " BatchSampler), or switch injection off with `Trainer(use_distributed_sampler=False)` and shard"
                " the data across ranks in your batch sampler yourself."
            ) from error


def is_distributed(run: Any) -> bool:
    """The connector's ``is_distributed`` for a ``lightning.Trainer`` or ``lightning.Fabric``.

    The answer Lightning itself uses for sampler injection, metric syncing and the tuners; see
    :meth:`trainer_plugins.Connector.is_distributed` for the rule.

    Raises:
        ValueError: ``run`` was not built by the plugin-aware connector (trainer-plugins was not
            attached: see ``trainer_plugins.install``).
    """
    connector = getattr(run, "_accelerator_connector", None) or getattr(run, "_connector", None)
    plugin_connector = getattr(connector, "plugin_connector", None)
    if plugin_connector is None:
        raise ValueError(
            f"{type(run).__name__} was not built through trainer-plugins; call trainer_plugins.install() first"
        )
    return plugin_connector.is_distributed(run.strategy)


def explain(api: str = "trainer", **flags: Any) -> Any:
    """Resolve Trainer or Fabric flags without starting a run; return the :class:`Explanation`.

    Args:
        api: ``"trainer"`` or ``"fabric"``.
        **flags: ``accelerator``, ``devices``, ``strategy``, ``precision``, ``num_nodes``, ``plugins``,
            as for ``lightning.Trainer``/``lightning.Fabric``.

    Returns:
        The decisions: which plugin supplied each role and why (``str()`` for a table).

    Raises:
        ValueError, TypeError, NotImplementedError, ModuleNotFoundError: the flags are invalid, as
            the Trainer or Fabric would raise them.
    """
    connectors = {"trainer": TrainerConnector, "fabric": FabricConnector}
    if api not in connectors:
        raise ValueError(f"api must be 'trainer' or 'fabric', got {api!r}")
    token = _EXPLAINING.set(True)
    try:
        return connectors[api](**flags).plugin_connector.explanation
    finally:
        _EXPLAINING.reset(token)
