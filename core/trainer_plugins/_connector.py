"""The connector: answers, for one run, which object fills each role, by asking the plugins.

Each question goes to the hooks first; a ``None`` answer means "no plugin claims this", and the
Lightning adapter (:mod:`trainer_plugins._lightning`) then applies Lightning's own rule. Every answer
is recorded as a :class:`Decision`, so a run can explain where each role came from.
"""

from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass, replace
from typing import Any, Optional, Union

from lightning.fabric.utilities.rank_zero import rank_zero_deprecation

from trainer_plugins._builtin import DISTRIBUTED_STRATEGIES
from trainer_plugins._catalog import Catalog, Claim, get_catalog
from trainer_plugins._controls import PIN_VARIABLES, read_pins
from trainer_plugins._entries import APIS
from trainer_plugins._manager import BUILTIN_PLUGIN, USER_ERRORS, PluginError, Run, add_note
from trainer_plugins._standalone import PACKAGES, resolve_in

#: Lightning's import root for each api.
LIGHTNING_ROOT = {"trainer": "lightning.pytorch", "fabric": "lightning.fabric"}
#: How messages name each api.
API_NAMES = {"trainer": "Trainer", "fabric": "Fabric"}
#: Flag values Lightning itself interprets for each role (never looked up in the catalogue).
KEYWORDS = {"accelerator": ("auto", "gpu"), "strategy": ("auto",)}
LIGHTNING_RULE = "Lightning's own rule (no plugin claims this)"
#: Roles the start-up line names, and the longest line it may be (characters).
STARTUP_ROLES = ("accelerator", "strategy", "precision", "environment")
STARTUP_LINE_LIMIT = 120


@dataclass(frozen=True)
class Decision:
    """How one role of a run was filled.

    Attributes:
        role: ``"accelerator"``, ``"devices"``, ``"environment"``, ``"strategy"``, ``"precision"`` or
            ``"is_distributed"``.
        choice: the object chosen, as ``"name (module.Class)"`` or a value.
        plugin: the plugin that supplied it, as ``"name (distribution version)"``.
        reason: why (availability, priority, pin, declared compatibility, ...).
    """

    role: str
    choice: str
    plugin: str
    reason: str


class Explanation(list):  # type: ignore[type-arg]
    """The decisions of one run, in the order they were taken; ``str()`` gives a readable table."""

    def as_dicts(self) -> list[dict[str, str]]:
        """The decisions as plain dictionaries (for JSON)."""
        return [asdict(decision) for decision in self]

    def __str__(self) -> str:
        width = max((len(d.role) for d in self), default=0)
        return "\n".join(f"{d.role:<{width}}  {d.choice}  <- {d.plugin}: {d.reason}" for d in self)


def describe(obj: Any) -> str:
    """``"module.Class"`` for an object, or ``repr`` for a plain value."""
    if isinstance(obj, (str, int, float, bool, list, tuple)) or obj is None:
        return repr(obj)
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


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

    @property
    def catalog(self) -> Catalog:
        """The declared names this connector asks about (the process-wide catalogue after unpickling)."""
        if self._catalog is None:
            self._catalog = get_catalog()
        return self._catalog

    def __getstate__(self) -> dict[str, Any]:
        # Trainers are pickled into XLA worker processes; plugin modules are not picklable and each
        # process has its own plugin manager, so the catalogue is looked up again there.
        return {**self.__dict__, "_catalog": None}

    # --- bookkeeping -----------------------------------------------------------------------------

    def note(self, role: str, choice: Any, plugin: str, reason: str) -> None:
        """Record a decision (``choice`` may be an object or a value).

        A second note for a role already decided (the object built from a chosen name) only
        refines the recorded choice; the first decision's plugin and reason stay.
        """
        text = choice if isinstance(choice, str) else self.describe_as(role, choice)
        for index, decision in enumerate(self.explanation):
            if decision.role == role:
                self.explanation[index] = Decision(role, text, decision.plugin, decision.reason)
                return
        self.explanation.append(Decision(role, text, plugin, reason))

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

    def load_class(self, claim: Claim) -> Any:
        """The class of ``claim`` for this api, imported under the plugin guard.

        Raises:
            ModuleNotFoundError: a module the class needs is not installed (a missing runtime); the
                message names the plugin and its distribution.
            PluginError: the class cannot be imported otherwise or is not of its role's Lightning
                base class; the message names the plugin and its distribution.
        """
        path = claim.entry.class_path(self.api)
        action = f"loading {claim.entry.role} class {path}"
        manager = self.catalog.manager
        return manager.guard(
            claim.plugin, action, claim.entry.load, self.api, self.package, passthrough=(ModuleNotFoundError,)
        )

    # --- names -----------------------------------------------------------------------------------

    def names(self, role: str) -> list[str]:
        """Usable names of ``role`` for this api, built-in and plugin-provided."""
        return self.catalog.names(role, self.api)

    def check_name(self, role: str, flag: Any, lightning_names: list[str]) -> None:
        """Refuse a name that plugins contest or that exists only for the other API; unknown names are
        left to Lightning's own check.

        Raises:
            PluginConflictError: ``flag`` is claimed by plugins without an override; the message
                names the claimants.
            ValueError: ``flag`` names an entry with a class for the other API only (Trainer vs
                Fabric); the message says so.
        """
        if isinstance(flag, str) and flag.lower() not in KEYWORDS[role] and flag not in lightning_names:
            self.catalog.find(role, flag.lower())
            if flag.lower() not in self.catalog.names(role, self.api, include_deprecated=True):
                self._check_other_api(role, flag)

    def valid_names(self, role: str, lightning_names: list[str]) -> list[str]:
        """The names Lightning's own check accepts for ``role``: Lightning's, then the plugins' (each once).

        Deprecated plugin names are included: selecting one works (with a deprecation warning).
        """
        plugin_names = self.catalog.names(role, self.api, include_deprecated=True)
        return list(dict.fromkeys([*lightning_names, *plugin_names]))

    def extend_name_error(self, role: str, message: str, lightning_names: list[str]) -> str:
        """Lightning's message for an invalid ``role`` name, with what plugins add appended (never rephrased).

        Lightning's accelerator message already lists every valid name (:meth:`valid_names`); its
        strategy message lists examples only, so the plugins' strategy names are appended. The
        quarantined plugins, if any, end the message.
        """
        added = [name for name in self.valid_names(role, lightning_names) if name not in lightning_names]
        if role == "strategy" and added:
            message += f" Strategies from installed plugins: {', '.join(added)}."
        return message + self.catalog.quarantine_note()

    def _check_other_api(self, role: str, flag: str) -> None:
        """Reject a name that exists only for the other API (Trainer vs Fabric), saying so.

        Raises:
            ValueError: ``flag`` names a ``role`` entry with a class for the other API only.
        """
        other = next(api for api in APIS if api != self.api)
        claim = self.catalog.claims.get(role, {}).get(flag.lower())
        if claim is None or claim.entry.class_path(other) is None:
            return
        raise ValueError(
            f"`{role}={flag!r}` is for the {API_NAMES[other]} only: {claim.plugin.label} provides no"
            f" {API_NAMES[self.api]} class for this {role}. Use it with lightning.{API_NAMES[other]}, or choose one"
            f" of the {API_NAMES[self.api]}'s names: {', '.join((*KEYWORDS[role], *self.names(role)))}."
        )

    def canonical(self, role: str, flag: Any) -> Any:
        """The main name of the entry a plugin-provided name belongs to (deprecated aliases warn)."""
        if not isinstance(flag, str):
            return flag
        claim = self.catalog.find(role, flag.lower())
        if claim is None or claim.builtin:
            return flag
        if claim.deprecated:
            rank_zero_deprecation(f"The {role} name {flag!r} is deprecated. Use `{role}={claim.entry.name!r}` instead.")
        return claim.entry.name

    def plugin_claim(self, role: str, name: Any) -> Optional[Claim]:
        """The plugin (not built-in) claim on ``name``, or ``None``.

        Raises:
            PluginError: the claiming plugin is quarantined; the message names its distribution,
                version and original exception.
            PluginConflictError: the name is contested by plugins without an override.
        """
        if not isinstance(name, str):
            return None
        claim = self.catalog.find(role, name.lower())
        if claim is None or claim.builtin:
            return None
        if claim.plugin.state != "loaded":
            raise self.catalog.manager.error_for(claim.plugin, f"provide {role} {name!r}")
        return claim

    def _pin(self, role: str) -> Optional[str]:
        """The name pinned for ``role`` by the controls, or ``None``.

        Raises:
            ValueError: the pinned name is not registered; the message lists the registered names.
        """
        pinned = self.controls.pins.get(role)
        if pinned and pinned not in self.catalog.names(role, self.api, include_deprecated=True):
            raise ValueError(
                f"{PIN_VARIABLES[role]}={pinned!r} names no {role}; choose one of {', '.join(self.names(role))}"
            )
        if pinned:
            self.note(role, pinned, "controls", f"pinned by {PIN_VARIABLES[role]}")
        return pinned

    def _instantiate(self, claim: Claim, **kwargs: Any) -> Any:
        """Build ``claim``'s class under the plugin guard.

        Raises:
            ValueError, TypeError, NotImplementedError, ModuleNotFoundError: the constructor rejected
                the run (a bad setting, a missing runtime); passed on unchanged, like a decision
                hook's (a note in the traceback names the plugin).
            Exception: anything else the constructor raised, of the same type, with the plugin and
                its distribution named in front of the message.
            PluginError: the constructor raised something else (``SystemExit``, ...).
        """
        cls = self.load_class(claim)
        arguments = {**getattr(claim.entry, "init_kwargs", {}), **kwargs}
        return self.catalog.manager.guard(
            claim.plugin, f"{cls.__qualname__}()", cls, passthrough=(Exception,), unchanged=USER_ERRORS, **arguments
        )

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
        for priority, name, claim in self._auto_candidates():
            if self._available(name, claim):
                reason = f"available, highest auto priority ({priority})"
                if skipped:
                    reason += "; not available: " + ", ".join(skipped)
                self.note("accelerator", name, claim.plugin.label, reason)
                return name
            skipped.append(f"{name} ({priority})")
        raise RuntimeError("No accelerator is available, not even 'cpu'.")  # cpu is always available

    def _auto_candidates(self) -> list[tuple[int, str, Claim]]:
        """``(priority, name, claim)`` of each loaded accelerator ``"auto"`` may pick, best first."""
        candidates = []
        for name, claim in self.catalog.claims.get("accelerator", {}).items():
            priority = getattr(claim.entry, "auto_priority", None)
            usable = claim.plugin.state == "loaded" and claim.entry.class_path(self.api) is not None
            if name == claim.entry.name and priority is not None and usable:
                candidates.append((priority, name, claim))
        return sorted(candidates, key=lambda candidate: -candidate[0])

    def _available(self, name: str, claim: Claim) -> bool:
        """Whether accelerator ``name`` can run here, for this run.

        A probe (or ``is_available()``) that raises, answers with a non-boolean, does not answer
        within the probe timeout, or whose class cannot be imported makes its plugin not available
        for this run only (reported once as a ``PluginWarning``); the next run asks again.
        """
        if name not in self.run.answers:
            self.run.answers[name] = self._ask_available(name, claim)
        return self.run.answers[name]

    def _ask_available(self, name: str, claim: Claim) -> bool:
        manager = self.catalog.manager
        answer = manager.call_first("trainer_plugins_accelerator_available", run=self.run, name=name)
        if not claim.live or claim.plugin.name in self.run.unavailable:
            return False
        if answer is not None:
            return bool(answer[1])
        try:
            accelerator_class: Any = self.load_class(claim)
            timeout = None if claim.builtin else self.controls.probe_timeout
            available = manager.guard(
                claim.plugin,
                f"{accelerator_class.__qualname__}.is_available()",
                accelerator_class.is_available,
                timeout=timeout,
            )
        except (PluginError, ModuleNotFoundError) as fault:
            manager.not_available(claim.plugin, self.run, fault)
            return False
        return bool(available)

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
        accelerator = self._instantiate(claim)
        self.note("accelerator", f"{claim.name} ({describe(accelerator)})", claim.plugin.label, "registered name")
        return accelerator

    # --- environment -----------------------------------------------------------------------------

    def choose_environment(self, accelerator: Any) -> Optional[Any]:
        """The cluster environment from the pin or the plugins, or ``None`` for Lightning's detection."""
        pinned = self._pin("environment")
        if pinned:
            return self._pinned_environment(pinned, accelerator)
        answer = self._ask_first(
            "trainer_plugins_select_environment", self._owners(accelerator=accelerator), accelerator=accelerator
        )
        if answer is None:
            return None
        record, environment = answer
        self.note("environment", environment, record.label, "the accelerator's plugin chose it")
        return environment

    def _pinned_environment(self, pinned: str, accelerator: Any) -> Any:
        """Build the pinned cluster environment, refusing one that does not apply to this run.

        Lightning's rule: an environment applies when its class's ``detect()`` says the process runs
        under it; a plugin's environment also needs that plugin's accelerator.

        Raises:
            ValueError: the pinned environment does not apply; the message names the variable, the
                environment and why.
        """
        claim = self.catalog.claims["environment"][pinned]
        cls = self.load_class(claim)
        variable = f"{PIN_VARIABLES['environment']}={pinned!r}"
        detected = self.catalog.manager.guard(claim.plugin, f"{cls.__qualname__}.detect()", cls.detect)
        accelerator_owner = self.catalog.owner_of(accelerator, "accelerator", self.api)
        if not detected:
            why = f"{cls.__qualname__}.detect() is False: this process does not run under it"
        elif not claim.builtin and (accelerator_owner is None or accelerator_owner.plugin is not claim.plugin):
            why = (
                f"it belongs to plugin {claim.plugin.label}, and the accelerator {describe(accelerator)}"
                " is not that plugin's"
            )
        else:
            return self._instantiate(claim)
        raise ValueError(
            f"{variable} does not apply to this run: {why}. Unset {PIN_VARIABLES['environment']} or run"
            " under that environment."
        )

    # --- strategy --------------------------------------------------------------------------------

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
        single = resolve_in(f"{LIGHTNING_ROOT[self.api]}.strategies:SingleDeviceStrategy", self.package)(
            device=parallel_devices[0]
        )
        self.note(
            "strategy",
            single,
            "trainer-plugins",
            f"plugin accelerator without a strategy choice, on {parallel_devices[0]}",
        )
        return single

    def make_strategy(self, name: str, parallel_devices: list[Any]) -> Optional[Any]:
        """Build a plugin-provided strategy by name, or ``None`` when ``name`` is Lightning's.

        A single-device strategy is given the accelerator's device (``parallel_devices[0]``).
        """
        claim = self.plugin_claim("strategy", name)
        if claim is None:
            return None
        cls = self.load_class(claim)
        single = resolve_in(f"{LIGHTNING_ROOT[self.api]}.strategies:SingleDeviceStrategy", self.package)
        device = {"device": parallel_devices[0]} if issubclass(cls, single) else {}
        strategy = self._instantiate(claim, **device)
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
        single = resolve_in(f"{LIGHTNING_ROOT[self.api]}.strategies:SingleDeviceStrategy", self.package)
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
        self._add_reason("strategy", f"pairing accepted by {', '.join(judges)}" if judges else "")

    def _add_reason(self, role: str, text: str) -> None:
        for index, decision in enumerate(self.explanation):
            if decision.role == role and text:
                self.explanation[index] = Decision(role, decision.choice, decision.plugin, f"{decision.reason}; {text}")

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

    # --- is_distributed --------------------------------------------------------------------------

    def distributed_strategies(self) -> tuple[type, ...]:
        """The whitelist: Lightning's distributed strategies plus every strategy a plugin declared distributed."""
        if self._whitelist is None:
            classes = [resolve_in(path, self.package) for path in DISTRIBUTED_STRATEGIES[self.api]]
            for claim in self.catalog.claims.get("strategy", {}).values():
                declared = claim.live and getattr(claim.entry, "distributed", False)
                cls = claim.entry.loaded_class(self.api, self.package) if declared else None
                if cls is not None and cls not in classes:
                    classes.append(cls)
            self._whitelist = tuple(classes)
        return self._whitelist

    def is_distributed(self, strategy: Any) -> bool:
        """Whether a run with ``strategy`` is distributed (SPEC, "Names, legacy names and is_distributed").

        1. ``True`` if ``strategy`` is an instance of a whitelisted class
           (:meth:`distributed_strategies`);
        2. else, if the strategy has an ``is_distributed`` attribute (custom strategies), its answer:
           see :func:`own_is_distributed` (a property or plain value is read, a method is called);
        3. else ``False``.

        Raises:
            TypeError: the strategy's own answer is not a ``bool`` (the message names its class).
            Exception: whatever reading or calling the strategy's ``is_distributed`` raised,
                ``AttributeError`` included; it is never taken to mean "not distributed".
        """
        if isinstance(strategy, self.distributed_strategies()):
            return True
        answer = own_is_distributed(strategy)
        return False if answer is None else answer

    def startup_line(self) -> Optional[str]:
        """The one line a run logs at start-up, or ``None`` when no plugin supplied a role.

        Names each role a plugin (not Lightning, not trainer-plugins' own fallback) supplied, grouped
        by distribution: ``"trainer-plugins: accelerator=xla, strategy=single_xla, precision=xla,
        environment=xla from xla-plugins 0.1.0"``. At most :data:`STARTUP_LINE_LIMIT` characters
        (cut with ``"..."``); the full table is :func:`trainer_plugins.explain` and the DEBUG log.
        """
        sources = {
            record.label: f"{record.distribution} {record.version}" if record.distribution else record.name
            for record in self.catalog.manager.records.values()
            if record.name != BUILTIN_PLUGIN
        }
        supplied: dict[str, list[str]] = {}
        for decision in self.explanation:
            if decision.role in STARTUP_ROLES and decision.plugin in sources:
                name = decision.choice.split(" (")[0]
                supplied.setdefault(sources[decision.plugin], []).append(f"{decision.role}={name}")
        if not supplied:
            return None
        line = "trainer-plugins: " + "; ".join(f"{', '.join(roles)} from {who}" for who, roles in supplied.items())
        return line if len(line) <= STARTUP_LINE_LIMIT else line[: STARTUP_LINE_LIMIT - 3] + "..."

    def explain_is_distributed(self, strategy: Any) -> None:
        """Record the ``is_distributed`` answer and which rule gave it."""
        if isinstance(strategy, self.distributed_strategies()):
            answer, rule = True, "whitelisted distributed strategy"
        elif (own := own_is_distributed(strategy)) is not None:
            answer, rule = own, "the strategy's own is_distributed attribute"
        else:
            answer, rule = False, "not whitelisted and no is_distributed attribute"
        self.note("is_distributed", repr(answer), "trainer-plugins", rule)


def own_is_distributed(strategy: Any) -> Optional[bool]:
    """A strategy's own ``is_distributed`` answer, or ``None`` if it has no such attribute (rule 2).

    * a property or plain attribute: its value;
    * a method (any callable value): called without arguments, its result is the answer, so
      ``def is_distributed(self): return False`` means ``False`` (a bound method is always truthy and
      would otherwise read as ``True``).

    The answer must be a ``bool``. The attribute counts as absent only when the class and the instance
    do not define it at all: a property that raises (``AttributeError`` included) is a fault of the
    strategy and propagates, with a note naming the class.

    Raises:
        TypeError: the answer is not a ``bool``.
        Exception: what the property or the method raised.
    """
    name = f"{type(strategy).__module__}.{type(strategy).__qualname__}.is_distributed"
    try:
        answer = strategy.is_distributed
        if callable(answer):
            answer = answer()
    except AttributeError as error:
        if inspect.getattr_static(strategy, "is_distributed", _ABSENT) is _ABSENT:
            return None  # no such attribute anywhere: rule 3
        add_note(error, f"raised while trainer-plugins read {name}")
        raise
    except Exception as error:
        add_note(error, f"raised while trainer-plugins read {name}")
        raise
    if not isinstance(answer, bool):
        raise TypeError(
            f"{name} must be a bool (or a method returning one) saying whether the run is distributed, got {answer!r}."
        )
    return answer


_ABSENT = object()
