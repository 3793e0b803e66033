"""The connector: answers, for one run, which object fills each role, by asking the plugins.

Each question goes to the hooks first; a ``None`` answer means "no plugin claims this", and the
Lightning adapter (:mod:`trainer_plugins._lightning`) then applies Lightning's own rule. Every answer
is recorded as a :class:`~trainer_plugins.Decision` (:mod:`trainer_plugins._explanation`), so a run
can explain where each role came from. Which names a run may use is :mod:`trainer_plugins._names`'
business, and whether it is distributed :mod:`trainer_plugins._is_distributed`'s.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Optional, Union

from trainer_plugins import _is_distributed
from trainer_plugins._availability import accelerator_available
from trainer_plugins._builtin import HOST_ENVIRONMENTS
from trainer_plugins._catalog import Catalog, Claim, get_catalog
from trainer_plugins._controls import PIN_VARIABLES, read_pins
from trainer_plugins._entries import APIS
from trainer_plugins._errors import PluginError
from trainer_plugins._explanation import Explanation, describe
from trainer_plugins._launch_environment import LaunchEnvironment, apply
from trainer_plugins._names import plugin_claim
from trainer_plugins._pins import pinned_environment, pinned_name
from trainer_plugins._records import BUILTIN_PLUGIN, Run
from trainer_plugins._spec_checks import LAUNCH_ENVIRONMENT_HOOK
from trainer_plugins._standalone import PACKAGES, resolve_in

#: Lightning's import root for each api.
LIGHTNING_ROOT = {"trainer": "lightning.pytorch", "fabric": "lightning.fabric"}


class Connector:
    """Asks the plugins which accelerator, environment, strategy and precision a run uses.

    Args:
        api: ``"trainer"`` (``lightning.Trainer``) or ``"fabric"`` (``lightning.Fabric``).
        catalog: the declared names; default the process-wide catalogue.
        package: the Lightning packaging of the run: ``"lightning"`` or ``"pytorch_lightning"``
            (``pytorch_lightning.Trainer``/``lightning_fabric.Fabric``); classes are built for it.

    Raises:
        ValueError: unknown ``api`` or ``package``.
    """

    def __init__(self, api: str, catalog: Optional[Catalog] = None, package: str = "lightning") -> None:
        if api not in APIS:
            raise ValueError(f"api must be one of {APIS}, got {api!r}")
        if package not in PACKAGES:
            raise ValueError(f"package must be one of {PACKAGES}, got {package!r}")
        self.api = api
        self.package = package
        self._catalog = catalog if catalog is not None else get_catalog()
        # the plugin manager's controls (read before plugins loaded), with the pins as they are now
        self.controls = replace(self._catalog.manager.controls, pins=read_pins())
        self.run = Run()
        self.explanation = Explanation()
        self._whitelist: Optional[tuple[type, ...]] = None
        self._pinned_strategy: Optional[str] = None  # the name strategy="auto" took from the pin

    @property
    def catalog(self) -> Catalog:
        """The declared names this connector asks about (the process-wide catalogue after unpickling)."""
        if self._catalog is None:
            self._catalog = get_catalog()
        return self._catalog

    def __getstate__(self) -> dict[str, Any]:
        # Trainers are pickled into the worker processes of spawning launchers; plugin modules are not
        # picklable and each process has its own plugin manager, so the catalogue is looked up again there.
        return {**self.__dict__, "_catalog": None}

    # --- bookkeeping -----------------------------------------------------------------------------

    def note(self, role: str, choice: Any, plugin: str, reason: str) -> None:
        """Record a decision (``choice`` may be an object or a value; see :meth:`Explanation.note`)."""
        text = choice if isinstance(choice, str) else self.describe_as(role, choice)
        self.explanation.note(role, text, plugin, reason)

    def describe_as(self, role: str, obj: Any, name: Optional[str] = None) -> str:
        """How decisions show ``obj``: ``"name (module.Class)"``, with ``name`` or the one entry naming its class."""
        name = name or self.catalog.name_of(obj, role, self.api)
        return f"{name} ({describe(obj)})" if name else describe(obj)

    def _owners(self, **objects: Any) -> frozenset[str]:
        """Names of the plugins whose classes ``objects`` (role=object) are instances of."""
        owners = (self.catalog.owner_of(obj, role, self.api) for role, obj in objects.items())
        return frozenset(claim.plugin.name for claim in owners if claim is not None)

    def _ask_first(self, hook: str, owners: frozenset[str], **kwargs: Any) -> Optional[tuple[Any, Any]]:
        return self.catalog.manager.call_first(hook, owners, self.run, api=self.api, **kwargs)

    def _pin(self, role: str) -> Optional[str]:
        """The name pinned for ``role`` by the controls (noted as the decision), or ``None``.

        Raises:
            ValueError: the pinned name is not registered; the message lists the registered names.
        """
        pinned = pinned_name(self.catalog, self.api, role, self.controls.pins)
        if pinned:
            self.note(role, pinned, "controls", f"pinned by {PIN_VARIABLES[role]}")
        return pinned

    # --- accelerator -----------------------------------------------------------------------------

    def choose_auto_accelerator(self) -> str:
        """The accelerator ``accelerator="auto"`` means: the pin, else the available one of highest priority.

        Availability comes from the owning plugin's probe hook, else from the class's
        ``is_available()`` (Lightning's rule for its own accelerators).
        """
        pinned = self._pin("accelerator")
        if pinned:
            return pinned
        skipped: list[str] = []
        for priority, name, claim in self.catalog.auto_candidates(self.api):
            if self._available(name, claim):
                reason = f"available, highest auto priority ({priority})"
                if skipped:
                    reason += "; not available: " + ", ".join(skipped)
                self.note("accelerator", name, claim.plugin.label, reason)
                return name
            skipped.append(f"{name} ({priority})")
        raise RuntimeError("No accelerator is available, not even 'cpu'.")  # cpu is always available

    def _available(self, name: str, claim: Claim) -> bool:
        args = (self.catalog.manager, self.run, name, claim, self.api, self.package, self.controls.probe_timeout)
        return accelerator_available(*args)

    def make_accelerator(self, claim: Claim) -> Any:
        """Build the accelerator of a plugin claim (its constructor reports a missing runtime).

        Its plugin's probe (or the class's ``is_available()``) is asked first, bounded by the probe
        timeout, so that a wedged or failing driver gives an error instead of a hang.

        Raises:
            PluginError: the probe failed or did not answer in time; the message names the plugin,
                its distribution and why.
        """
        self._available(claim.name, claim)
        reason = self.run.unavailable.get(claim.plugin.name)
        if reason:
            error = PluginError(f"plugin {claim.plugin.label} cannot provide accelerator {claim.name!r}: {reason}")
            error.plugin = claim.plugin
            raise error
        accelerator = claim.build(self.api, self.package)
        self.note("accelerator", f"{claim.name} ({describe(accelerator)})", claim.plugin.label, "registered name")
        return accelerator

    # --- environment -----------------------------------------------------------------------------

    def choose_environment(self, accelerator: Any) -> Optional[Any]:
        """The cluster environment from the pin, the hosts' variables or a plugin; ``None``: Lightning detects it.

        The order: the pin; the accelerator's plugin (``trainer_plugins_select_environment``, e.g.
        the XLA plugin's ``XLAEnvironment``, whose runtime reads the TPU VM's variables itself);
        Lightning's launchers' environments, left to Lightning's own detection
        (:func:`trainer_plugins.environments.launcher_variables`: torchrun, SLURM, LSF, MPI,
        ``LightningEnvironment``'s and ``KubeflowEnvironment``'s variables); the first of
        ``trainer_plugins._builtin.HOST_ENVIRONMENTS`` whose variables are set (TPU VM, Indexed
        Job, SkyPilot). A backend whose plugin chooses an environment keeps it on every host, so
        the host environments change nothing for it.

        Raises:
            ValueError: a host environment's variables are partial or contradictory (the message names them).
        """
        pinned = self._pin("environment")
        if pinned:
            return pinned_environment(self.catalog, self.api, self.package, pinned, accelerator)
        answer = self._ask_first(
            "trainer_plugins_select_environment", self._owners(accelerator=accelerator), accelerator=accelerator
        )
        if answer is None:
            return self._host_environment()
        record, environment = answer
        self.note("environment", environment, record.label, "the accelerator's plugin chose it")
        return environment

    def _host_environment(self) -> Optional[Any]:
        """The first host environment whose ``detect()`` is true; ``None`` also where a Lightning launcher's applies.

        Lightning's launchers are asked only where host variables are set (MPI's ``detect()`` starts MPI).
        """
        claims = (self.catalog.claims["environment"].get(entry.name) for entry in HOST_ENVIRONMENTS)
        detected = [claim for claim in claims if claim is not None and claim.load(self.api, self.package).detect()]
        if not detected:
            return None
        if resolve_in("trainer_plugins.environments:launcher_variables", self.package)() is not None:
            return None
        environment = detected[0].build(self.api, self.package)
        self.note("environment", environment, "trainer-plugins", environment.describe())
        return environment

    # --- strategy --------------------------------------------------------------------------------

    def _single_device_strategy(self) -> type:
        """Lightning's ``SingleDeviceStrategy`` for this api and packaging."""
        return resolve_in(f"{LIGHTNING_ROOT[self.api]}.strategies:SingleDeviceStrategy", self.package)

    def choose_strategy(
        self, accelerator: Any, parallel_devices: list[Any], num_nodes: int
    ) -> Optional[Union[str, Any]]:
        """What ``strategy="auto"`` means here: the pin, a plugin's choice, or ``None`` for Lightning's rule.

        For an accelerator that a plugin provides but whose plugin does not choose, the strategy
        runs on the accelerator's own device: a single-device strategy for one device, ``"ddp"``
        for several (never Lightning's CPU default).
        """
        pinned = self._pin("strategy")
        if pinned:
            self._pinned_strategy = pinned
            return pinned
        owners = self._owners(accelerator=accelerator)
        answer = self._ask_first(
            "trainer_plugins_select_strategy",
            owners,
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            num_nodes=num_nodes,
        )
        if answer is not None:
            record, name = answer
            self.note(
                "strategy", name, record.label, f"chosen for {len(parallel_devices)} device(s), {num_nodes} node(s)"
            )
            return name
        if not owners - {BUILTIN_PLUGIN}:
            return None
        if len(parallel_devices) > 1 or num_nodes > 1:
            self.note(
                "strategy", "ddp", "trainer-plugins", "plugin accelerator without a strategy choice, several devices"
            )
            return "ddp"
        single = self._single_device_strategy()(device=parallel_devices[0])
        self.note(
            "strategy",
            single,
            "trainer-plugins",
            f"plugin accelerator without a strategy choice, on {parallel_devices[0]}",
        )
        return single

    def strategy_for_name(self, flag: Any, accelerator: Any) -> Any:
        """The strategy that ``flag``, one of Lightning's names, means on ``accelerator``; else ``flag`` unchanged.

        Asks the accelerator's plugin (``trainer_plugins_strategy_for_name``), which may name its own
        strategy for it (``"ddp"`` on its device) or refuse it. A strategy instance, a plugin's name
        and a name pinned by ``TRAINER_PLUGINS_PIN_STRATEGY`` are returned unchanged, unasked.

        Raises:
            ValueError: the plugin refuses ``flag`` on its accelerator (its message, unchanged).
            PluginError: the plugin answered a name that no strategy registered for this api has.
        """
        if not isinstance(flag, str) or flag == self._pinned_strategy:
            return flag
        claim = self.catalog.find("strategy", flag.lower())
        if claim is None or not claim.builtin:
            return flag
        answer = self._ask_first(
            "trainer_plugins_strategy_for_name",
            self._owners(accelerator=accelerator),
            name=flag.lower(),
            accelerator=accelerator,
        )
        if answer is None:
            return flag
        record, name = answer
        registered = self.catalog.names("strategy", self.api)
        if name not in registered:
            error = PluginError(
                f"plugin {record.label} answered trainer_plugins_strategy_for_name({flag.lower()!r}) with {name!r},"
                f" which names no strategy of lightning.{self.api.capitalize()}; registered: {', '.join(registered)}"
            )
            error.plugin = record
            raise error
        decided = any(decision.role == "strategy" for decision in self.explanation)
        reason = f"Lightning's name {flag!r} on {describe(accelerator)}"
        self.note("strategy", name, record.label, reason)
        if decided:
            self.explanation.add_reason("strategy", f"{reason} means {name!r} ({record.label})")
        return name

    def make_strategy(self, name: str, parallel_devices: list[Any]) -> Optional[Any]:
        """Build a plugin-provided strategy by name, or ``None`` when ``name`` is Lightning's.

        A single-device strategy is given the accelerator's device (``parallel_devices[0]``).
        """
        claim = plugin_claim(self.catalog, "strategy", name)
        if claim is None:
            return None
        cls = claim.load(self.api, self.package)
        single = self._single_device_strategy()
        device = {"device": parallel_devices[0]} if issubclass(cls, single) else {}
        strategy = claim.build(self.api, self.package, **device)
        self.note("strategy", f"{claim.name} ({describe(strategy)})", claim.plugin.label, "registered name")
        return strategy

    def validate(
        self, accelerator: Any, strategy: Any, parallel_devices: list[Any], flags: Optional[dict[str, Any]] = None
    ) -> None:
        """Check the accelerator/strategy pair, then let every plugin reject it (errors propagate to the user).

        Args:
            accelerator: the run's Lightning ``Accelerator``.
            strategy: the run's Lightning ``Strategy``.
            parallel_devices: the devices the accelerator parsed from ``devices``.
            flags: the user's ``strategy`` and ``devices`` flags, for error messages.

        Raises:
            ValueError: a strategy that drives one device (a ``SingleDeviceStrategy``), selected by name, was given
                an explicit ``devices`` of more than one device; the message names both flags.
        """
        flags = flags or {}
        single = self._single_device_strategy()
        by_name = isinstance(flags.get("strategy"), str)  # an instance the user built is Lightning's business
        if (
            by_name
            and isinstance(strategy, single)
            and len(parallel_devices) > 1
            and flags.get("devices", "auto") != "auto"
        ):
            name = flags.get("strategy")
            raise ValueError(
                f"`strategy={name!r}` drives one device, but `devices={flags.get('devices', len(parallel_devices))!r}`"
                f" selects {len(parallel_devices)}. Pass `devices=1` (or a one-device list) for it, or a"
                " multi-device strategy (`strategy='auto'` picks one)."
            )
        owners = self._owners(accelerator=accelerator, strategy=strategy)
        self.catalog.manager.call_each(
            "trainer_plugins_validate",
            owners,
            self.run,
            accelerator=accelerator,
            strategy=strategy,
            parallel_devices=parallel_devices,
            api=self.api,
        )
        judges = sorted(self.catalog.manager.record_of(name).label for name in owners)
        self.explanation.add_reason("strategy", f"pairing accepted by {', '.join(judges)}" if judges else "")

    def accepts_lightning_refusal(self, error: ValueError, accelerator: Any, strategy: Any) -> bool:
        """Whether the plugins of the pair accept ``error``, Lightning's refusal of it in its last check.

        Asked through ``trainer_plugins_accept_lightning_refusal``; only the plugins the accelerator
        or the strategy belongs to (not Lightning) are heard: one must answer ``True`` and none ``False``.
        """
        owners = self._owners(accelerator=accelerator, strategy=strategy) - {BUILTIN_PLUGIN}
        answers = self.catalog.manager.call_each(
            "trainer_plugins_accept_lightning_refusal",
            owners,
            self.run,
            error=error,
            accelerator=accelerator,
            strategy=strategy,
            api=self.api,
        )
        verdicts = {answer for record, answer in answers if record.name in owners}
        return verdicts == {True}

    # --- precision -------------------------------------------------------------------------------

    def choose_precision(self, accelerator: Any, strategy: Any, precision: str, precision_input: Any) -> Optional[Any]:
        """The precision plugin a plugin builds for ``precision``, or ``None`` for Lightning's rule."""
        answer = self._ask_first(
            "trainer_plugins_select_precision",
            self._owners(accelerator=accelerator, strategy=strategy),
            accelerator=accelerator,
            strategy=strategy,
            precision=precision,
            precision_input=precision_input,
        )
        if answer is None:
            return None
        record, plugin = answer
        self.note("precision", plugin, record.label, f"handles precision={precision_input or precision!r}")
        return plugin

    # --- the pre-start environment ---------------------------------------------------------------

    def apply_launch_environment(
        self, accelerator: Any, strategy: Any, num_nodes: int, processes_per_node: int, started_externally: bool
    ) -> LaunchEnvironment:
        """Set the variables the plugins of the pair name for the run's workers, where they are unset.

        Asks ``trainer_plugins_launch_environment`` of the plugins the accelerator or the strategy
        belongs to; never changes a variable already set (:mod:`trainer_plugins._launch_environment`).

        Raises:
            ValueError: a plugin cannot derive its variables from this layout (its message says why).
        """
        answers = self.catalog.manager.call_each(
            LAUNCH_ENVIRONMENT_HOOK,
            self._owners(accelerator=accelerator, strategy=strategy),
            self.run,
            accelerator=accelerator,
            strategy=strategy,
            num_nodes=num_nodes,
            processes_per_node=processes_per_node,
            started_externally=started_externally,
            api=self.api,
        )
        done = apply(answers, os.environ)
        if done.set or done.kept:
            who = ", ".join(sorted({record.label for record, _ in answers}))
            self.note("launch_environment", done.describe(), who, "variables its workers need before they start")
        return done

    # --- is_distributed -------------------------------------------------------------------------

    def distributed_strategies(self) -> tuple[type, ...]:
        """The whitelist: Lightning's distributed strategies plus every strategy a plugin declared distributed."""
        if self._whitelist is None:
            self._whitelist = _is_distributed.whitelist(self.catalog, self.api, self.package)
        return self._whitelist

    def is_distributed(self, strategy: Any) -> bool:
        """Whether a run with ``strategy`` is distributed (SPEC, "Names, legacy names and is_distributed").

        The rule of :mod:`trainer_plugins._is_distributed`: ``True`` for a whitelisted class
        (:meth:`distributed_strategies`), else the strategy's own ``is_distributed`` attribute (a
        property or plain value is read, a method is called), else ``False``.

        Raises:
            TypeError: the strategy's own answer is not a ``bool`` (the message names its class).
            Exception: whatever reading or calling the strategy's ``is_distributed`` raised,
                ``AttributeError`` included; it is never taken to mean "not distributed".
        """
        return _is_distributed.decide(strategy, self.distributed_strategies())[0]

    def explain_is_distributed(self, strategy: Any) -> None:
        """Record the ``is_distributed`` answer and which step of the rule gave it."""
        answer, step = _is_distributed.decide(strategy, self.distributed_strategies())
        self.note("is_distributed", repr(answer), "trainer-plugins", step)

    def startup_line(self) -> Optional[str]:
        """The one line a run logs at start-up, or ``None`` (see :meth:`Explanation.startup_line`)."""
        return self.explanation.startup_line(self.catalog.manager.records.values())
