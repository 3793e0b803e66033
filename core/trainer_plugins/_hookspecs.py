"""The hook specification: what a plugin may tell the connector about the four roles of a run.

A plugin is a module (named by an entry point in the ``trainer_plugins`` group) whose functions are
decorated with :data:`hookimpl`. It declares what it provides with the four *declaration* hooks and
answers the connector's questions with the *decision* hooks. Every hook is optional.

Rules every implementation follows (the conformance kit in :mod:`trainer_plugins.testing` checks
them):

* Declaration hooks and :func:`trainer_plugins_accelerator_available` are called while plugins are
  listed or ``"auto"`` is resolved: they must not import a device runtime (torch_xla, CUDA, ...),
  start one, or grab a device.
* Decision hooks return ``None`` for objects that belong to another plugin. They may import heavy
  modules, because they are only reached once a run has been configured.
* A decision hook rejects a bad combination by raising ``ValueError``, ``TypeError``,
  ``NotImplementedError`` or ``ModuleNotFoundError``; the connector passes that error to the user
  unchanged. Any other exception is treated as a bug in the plugin (see ``docs/plugin-author.md``).
* ``api`` is ``"trainer"`` for ``lightning.Trainer`` and ``"fabric"`` for ``lightning.Fabric``; the
  objects returned must be of that flavour.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional

import pluggy

if TYPE_CHECKING:
    from trainer_plugins._entries import AcceleratorEntry, EnvironmentEntry, PrecisionEntry, StrategyEntry

#: Project name shared by the hook markers (pluggy's ``project_name``).
PROJECT_NAME = "trainer_plugins"

#: Version of this hook specification. Plugins declare which versions they support with a
#: module attribute ``TRAINER_PLUGINS_API`` holding a PEP 440 specifier such as ``">=1.0,<2"``.
#: Compatibility: an added hook or an added optional argument raises the minor version (a plugin
#: written for ``1.0`` works unchanged; one using the addition declares ``>=1.1``); a removed or
#: changed hook, argument or answer raises the major version. 1.1 added
#: :func:`trainer_plugins_accept_lightning_refusal`; 1.2 :func:`trainer_plugins_launch_environment`;
#: 1.3 :func:`trainer_plugins_strategy_for_name`.
HOOKSPEC_VERSION = "1.3"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# --- declarations: cheap, called when the catalogue of names is built ---------------------------


@hookspec
def trainer_plugins_accelerators() -> Sequence[AcceleratorEntry]:  # type: ignore[empty-body]
    """Declare the accelerators this plugin provides (names, classes, ``"auto"`` priority)."""


@hookspec
def trainer_plugins_strategies() -> Sequence[StrategyEntry]:  # type: ignore[empty-body]
    """Declare the strategies this plugin provides, and which of them are distributed."""


@hookspec
def trainer_plugins_precisions() -> Sequence[PrecisionEntry]:  # type: ignore[empty-body]
    """Declare the precision plugins this plugin provides and the precision strings they handle."""


@hookspec
def trainer_plugins_environments() -> Sequence[EnvironmentEntry]:  # type: ignore[empty-body]
    """Declare the cluster environments this plugin provides."""


# --- probe: cheap, called while resolving accelerator="auto" -------------------------------------


@hookspec(firstresult=True)
def trainer_plugins_accelerator_available(name: str) -> Optional[bool]:
    """Say whether the accelerator registered as ``name`` can run here.

    Args:
        name: a name this plugin declared in :func:`trainer_plugins_accelerators`.

    Returns:
        ``True``/``False``, or ``None`` when ``name`` is not this plugin's. Must not start a runtime.
    """


# --- decisions: called once a run is being configured --------------------------------------------


@hookspec(firstresult=True)
def trainer_plugins_select_strategy(
    accelerator: Any, parallel_devices: list[Any], num_nodes: int, api: str
) -> Optional[str]:
    """Name the strategy that ``strategy="auto"`` means for this accelerator and device list.

    Args:
        accelerator: the Lightning ``Accelerator`` instance of the run.
        parallel_devices: the ``torch.device`` objects the accelerator will use (length >= 1).
        num_nodes: number of hosts (``Trainer(num_nodes=...)``), >= 1.
        api: ``"trainer"`` or ``"fabric"``.

    Returns:
        A registered strategy name, or ``None`` when the accelerator is not this plugin's.
    """


@hookspec(firstresult=True)
def trainer_plugins_strategy_for_name(name: str, accelerator: Any, api: str) -> Optional[str]:
    """Name your strategy that one of Lightning's strategy names means on your accelerator (API 1.2).

    Lightning does this for its own XLA accelerator only (Fabric's ``strategy="fsdp"`` on
    ``accelerator="tpu"`` becomes ``"xla_fsdp"``); this hook lets the plugin of any accelerator do
    it, so that an unchanged script's ``strategy="ddp"`` runs that plugin's DDP class on its device.
    Asked once the accelerator exists, before Lightning checks and builds the strategy, when the
    user's ``strategy`` (or the name ``strategy="auto"`` resolved to) is one of Lightning's own
    names. Never asked for a strategy instance, a plugin's name, or a name pinned with
    ``TRAINER_PLUGINS_PIN_STRATEGY``: those are used as given.

    Args:
        name: the Lightning strategy name, lower case (``"ddp"``, ``"ddp_spawn"``, ``"fsdp"``, ...).
        accelerator: the Lightning ``Accelerator`` instance of the run.
        api: ``"trainer"`` or ``"fabric"``.

    Returns:
        A strategy name registered for ``api`` (usually one of yours) to use instead, or ``None``
        to keep Lightning's meaning (always ``None`` when the accelerator is not yours).

    Raises:
        ValueError: ``name`` cannot run on this accelerator; the message names it and the choices.
    """


@hookspec(firstresult=True)
def trainer_plugins_select_precision(
    accelerator: Any, strategy: Any, precision: str, precision_input: Any, api: str
) -> Any:
    """Build the precision plugin for a precision string on this accelerator/strategy.

    Args:
        accelerator: the Lightning ``Accelerator`` instance of the run.
        strategy: the Lightning ``Strategy`` instance of the run.
        precision: Lightning's normalised precision string (``"32-true"``, ``"16-mixed"``, ...).
        precision_input: the value exactly as the user passed it (``None`` for the default), so
            that error messages can quote it.
        api: ``"trainer"`` or ``"fabric"``.

    Returns:
        A Lightning ``Precision`` instance, or ``None`` when neither object is this plugin's.

    Raises:
        ValueError: the precision is not supported here; the message names it and the choices.
    """


@hookspec(firstresult=True)
def trainer_plugins_select_environment(accelerator: Any, api: str) -> Any:
    """Build the cluster environment for this accelerator (``None`` when it is not yours)."""


@hookspec
def trainer_plugins_validate(accelerator: Any, strategy: Any, parallel_devices: list[Any], api: str) -> None:
    """Reject an accelerator/strategy combination this plugin knows cannot work.

    Called for every plugin once the strategy exists. Raise ``ValueError`` (wrong pairing) or
    ``NotImplementedError`` (pairing known but unsupported) with a message naming the strategy and
    the valid choices; return ``None`` otherwise.
    """


@hookspec
def trainer_plugins_accept_lightning_refusal(
    error: ValueError, accelerator: Any, strategy: Any, api: str
) -> Optional[bool]:
    """Accept Lightning's refusal of a pairing of your accelerator or strategy that is known to work (API 1.1).

    Lightning's connector ends (the last statement of ``_lazy_init_strategy``, Lightning 2.5 and
    2.6) by checking the accelerator/strategy pair against a fixed list of its own strategy
    classes, and raises ``ValueError`` for any other class, a plugin's included: for example it
    accepts only its own XLA strategy classes on an ``XLAAccelerator``. Called with that error,
    once the pair has passed every plugin's :func:`trainer_plugins_validate`.

    Args:
        error: the ``ValueError`` Lightning raised.
        accelerator: the Lightning ``Accelerator`` instance of the run.
        strategy: the Lightning ``Strategy`` instance of the run.
        api: ``"trainer"`` or ``"fabric"``.

    Returns:
        ``True`` to accept the run as built (the error is dropped), ``False`` to let it reach the
        user, ``None`` when the error or the objects are not yours. Only the answers of the plugins
        the accelerator or the strategy belong to count: the run goes on when one of them says
        ``True`` and none says ``False``. Accept only the refusal of Lightning's last check, as
        what follows the statement that raised is skipped.
    """


@hookspec
def trainer_plugins_launch_environment(
    accelerator: Any, strategy: Any, num_nodes: int, processes_per_node: int, started_externally: bool, api: str
) -> Optional[Mapping[str, str]]:
    """Name the job-wide environment variables every worker of this run needs before any worker starts (API 1.2).

    Called once per ``Trainer``/``Fabric`` in every process, when the run's strategy is built and
    before a launcher starts a worker (Lightning's launchers start them in ``fit``/``launch``). The
    core sets each returned variable that is not set yet in ``os.environ``, so the workers our
    launcher starts inherit them, and a worker an outside launcher (torchrun, Ray, a scheduler)
    started without them gets them before its device starts. A variable already set, by the user,
    the engine or a parent process, is never changed. Read ``os.environ``; never write it.

    Args:
        accelerator: the Lightning ``Accelerator`` instance of the run.
        strategy: the Lightning ``Strategy`` instance of the run.
        num_nodes: hosts of the run (``Trainer(num_nodes=...)``), >= 1.
        processes_per_node: worker processes on each host (the devices of the run on this host), >= 1.
        started_externally: whether an outside launcher started this process (the cluster
            environment's ``creates_processes_externally``): values must then come out identical in
            every worker, as nothing runs before them.
        api: ``"trainer"`` or ``"fabric"``.

    Returns:
        ``{name: value}`` (strings), or ``None`` when neither object is this plugin's.

    Raises:
        ValueError: the layout cannot be derived (missing or contradictory variables); the message
            names them and what to set.
    """


# --- diagnostics: called by `trainer-plugins doctor` -------------------------------------------


@hookspec
def trainer_plugins_doctor() -> Optional[dict[str, Any]]:
    """Describe the environment of this plugin's backend for ``trainer-plugins doctor``.

    Returns:
        Ordered ``{label: value}`` pairs (versions, selected device, device count, runtime, ...),
        or ``None`` when the backend is not installed. May import and start the backend's runtime.
    """


#: The declaration hook of each role, in the order roles are resolved.
DECLARATION_HOOKS = {
    "accelerator": "trainer_plugins_accelerators",
    "strategy": "trainer_plugins_strategies",
    "precision": "trainer_plugins_precisions",
    "environment": "trainer_plugins_environments",
}
