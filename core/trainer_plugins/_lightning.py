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
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.fabric.utilities.rank_zero import rank_zero_info, rank_zero_only, rank_zero_warn
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector
from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector
from lightning.pytorch.trainer.connectors.data_connector import _DataConnector
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities.compile import _verify_strategy_supports_compile
from torch.utils.data import BatchSampler

from trainer_plugins._connector import Connector
from trainer_plugins._explanation import LIGHTNING_RULE
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
        explanation = self.plugin_connector.explanation
        line = self.plugin_connector.startup_line()
        if line is not None and not _EXPLAINING.get():
            rank_zero_info(line)
        _log_table(explanation)

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


def verify_strategy_supports_compile(model: Any, strategy: Any) -> None:
    """Lightning's check that ``strategy`` can run the compiled ``model``, knowing plugin strategies.

    Replaces ``_verify_strategy_supports_compile`` in Lightning's trainer module (see
    :mod:`trainer_plugins._attach`). A plugin strategy declared with
    ``StrategyEntry(supports_compile=True)`` is accepted; when Lightning refuses a plugin's strategy,
    its message (which lists Lightning's strategies only) is followed by the strategies of the same
    plugin that are declared to support a compiled module.

    Raises:
        RuntimeError: Lightning's, for a compiled model on a strategy that supports neither.
    """
    if getattr(model, "_compiler_ctx", None) is None:
        return
    from trainer_plugins import get_catalog

    catalog = get_catalog()
    claim = catalog.owner_of(strategy, "strategy", "trainer")
    if claim is None or claim.builtin:
        _verify_strategy_supports_compile(model, strategy)
        return
    if getattr(claim.entry, "supports_compile", False):
        return
    try:
        _verify_strategy_supports_compile(model, strategy)
    except RuntimeError as error:
        names = sorted(
            name
            for name, other in catalog.claims.get("strategy", {}).items()
            if other.plugin is claim.plugin
            and name == other.entry.name
            and getattr(other.entry, "supports_compile", False)
        )
        which = (
            f"of its strategies, {', '.join(map(repr, names))} {'runs' if len(names) == 1 else 'run'} a compiled"
            " module; pass the module uncompiled to the others"
            if names
            else "none of its strategies runs a compiled module; pass the module uncompiled"
        )
        raise RuntimeError(
            f"{error} Strategy {claim.entry.name!r} comes from plugin {claim.plugin.label}: {which}."
        ) from error


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


#: Checkpoint key under which the resolved plugin set is stored (see :class:`PluginSetCheckpointConnector`).
CHECKPOINT_KEY = "trainer_plugins"


def plugin_set_record(trainer: Any) -> dict[str, Any] | None:
    """Which plugin, at which version, supplied each role of ``trainer``'s run (``None``: not plugin-aware).

    Returns:
        ``{"decisions": [Decision as dict, ...], "plugins": [{"name", "distribution", "version", "state"}, ...]}``.
    """
    connector = getattr(trainer._accelerator_connector, "plugin_connector", None)
    if connector is None:
        return None
    records = connector.catalog.manager.records.values()
    return {
        "decisions": connector.explanation.as_dicts(),
        "plugins": [
            {"name": r.name, "distribution": r.distribution, "version": r.version, "state": r.state} for r in records
        ],
    }


class PluginSetCheckpointConnector(_CheckpointConnector):
    """Lightning's checkpoint connector, storing the run's plugin set in every full checkpoint.

    Every ``lightning.Trainer`` built by the plugin-aware connectors gets this class for its
    checkpoint connector (:class:`TrainerDataConnector`). The record sits under
    ``checkpoint["trainer_plugins"]`` (read it back with ``torch.load(path)["trainer_plugins"]``; see
    ``plugin_set_record``), added once Lightning has built the checkpoint, in every checkpoint
    but a weights-only one. It is not a callback: a callback is called on each of Lightning's
    callback hooks, six a training step, and costs Lightning's hook dispatch each time.
    """

    def dump_checkpoint(self, weights_only: bool | None = None) -> dict:
        checkpoint = super().dump_checkpoint(weights_only)
        record = None if weights_only else plugin_set_record(self.trainer)
        if record is not None:
            checkpoint[CHECKPOINT_KEY] = record
        return checkpoint

    def _parse_ckpt_path(self, state_fn: Any, ckpt_path: Any, model_provided: bool, model_connected: bool) -> Any:
        """Lightning's ``ckpt_path`` resolution; ``"last"`` takes complete ones only (:func:`last_checkpoint`)."""
        if ckpt_path != "last":
            return super()._parse_ckpt_path(state_fn, ckpt_path, model_provided, model_connected)
        path = last_checkpoint(self.trainer)
        if path is None:
            rank_zero_warn(
                f'.{state_fn.value}(ckpt_path="last") is set, but there is no last checkpoint available.'
                " No checkpoint will be loaded. HINT: Set `ModelCheckpoint(..., save_last=True)`."
            )
        return path


def last_checkpoint(trainer: Any) -> str | None:
    """The checkpoint ``fit(ckpt_path="last")`` resumes from: the newest complete one of Lightning's candidates.

    The candidates are Lightning's: each ``OnExceptionCheckpoint``'s path and each
    ``ModelCheckpoint``'s ``last*.ckpt`` files. Two differences from Lightning 2.6: a candidate
    found in a directory of an fsspec URL keeps its protocol (Lightning's lookup drops it, so
    ``memory://`` or ``gs://`` last checkpoints were never found), and a candidate counts only if
    the strategy's checkpoint IO says it is complete, when that plugin has an ``is_committed(path)``
    method (e.g. one writing a commit marker on an object store, which has no atomic rename);
    otherwise existing is enough, as in Lightning. The newest by modification time wins.
    """
    from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint

    candidates = {getattr(cb, "ckpt_path", None) for cb in trainer.callbacks if isinstance(cb, OnExceptionCheckpoint)}
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint):
            fs = callback._fs
            protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
            found = callback._find_last_checkpoints(trainer)
            candidates |= found if protocol in ("file", "local") else {fs.unstrip_protocol(p) for p in found}
    committed = getattr(trainer.strategy.checkpoint_io, "is_committed", None)
    times = {}
    for path in filter(None, candidates):
        fs = get_filesystem(path)
        if fs.exists(path) and (committed is None or committed(path)):
            times[path] = fs.modified(path)
    return max(times, key=times.__getitem__) if times else None


class PluginSetCheckpoint(Callback):
    """A callback storing the same record as :class:`PluginSetCheckpointConnector`, from ``on_save_checkpoint``.

    Not added by trainer-plugins any more (the checkpoint connector stores the record); a user who
    adds it gets the record written by Lightning's callback hook too, before the LightningModule's
    own ``on_save_checkpoint`` runs. Nothing is stored when the Trainer does not use the
    plugin-aware connector.
    """

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        record = plugin_set_record(trainer)
        if record is not None:
            checkpoint[CHECKPOINT_KEY] = record


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
