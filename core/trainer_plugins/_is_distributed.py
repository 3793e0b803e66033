"""The ``is_distributed`` rule (SPEC, "Names, legacy names and is_distributed"): whitelist, own attribute, ``False``.

Lightning asks its connector's ``is_distributed`` before injecting a ``DistributedSampler``, syncing
metrics and in its tuners; Lightning answers from a fixed list of its own strategy classes. The
plugin-aware connector answers with this rule:

1. ``True`` if the strategy is an instance of a whitelisted class (:func:`whitelist`): Lightning's
   distributed strategies and every strategy a plugin declared ``distributed=True``;
2. else, if the strategy has an ``is_distributed`` attribute (custom strategies), its answer
   (:func:`own_is_distributed`);
3. else ``False``.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

from trainer_plugins._builtin import DISTRIBUTED_STRATEGIES
from trainer_plugins._catalog import Catalog
from trainer_plugins._errors import add_note
from trainer_plugins._standalone import resolve_in

#: What the explanation says of each step of the rule.
WHITELISTED = (
    "one of Lightning's distributed strategy classes, or declared distributed by its plugin: each process"
    " trains on its share of the data (distributed sampler, synced metrics)"
)
OWN_ATTRIBUTE = "the strategy's own is_distributed attribute"
NEITHER = (
    "not one of Lightning's distributed strategy classes, not declared distributed by a plugin, and no"
    " is_distributed attribute: no distributed sampler, metrics not synced"
)


def whitelist(catalog: Catalog, api: str, package: str) -> tuple[type, ...]:
    """Lightning's distributed strategy classes plus every strategy class a plugin declared distributed.

    Args:
        catalog: the declared names.
        api: ``"trainer"`` or ``"fabric"``.
        package: the Lightning packaging of the run (``"lightning"`` or ``"pytorch_lightning"``).

    A plugin's class counts once its module is imported (a run using it has imported it); the
    whitelist never imports a plugin's class.
    """
    classes = [resolve_in(path, package) for path in DISTRIBUTED_STRATEGIES[api]]
    for claim in catalog.claims.get("strategy", {}).values():
        declared = claim.live and getattr(claim.entry, "distributed", False)
        cls = claim.entry.loaded_class(api, package) if declared else None
        if cls is not None and cls not in classes:
            classes.append(cls)
    return tuple(classes)


def decide(strategy: Any, whitelisted: tuple[type, ...]) -> tuple[bool, str]:
    """Whether a run with ``strategy`` is distributed, and which step of the rule said so.

    Args:
        strategy: the run's Lightning ``Strategy``.
        whitelisted: the classes of step 1 (:func:`whitelist`).

    Returns:
        ``(answer, step)``, ``step`` being :data:`WHITELISTED`, :data:`OWN_ATTRIBUTE` or :data:`NEITHER`.

    Raises:
        TypeError: the strategy's own answer is not a ``bool`` (the message names its class).
        Exception: whatever reading or calling the strategy's ``is_distributed`` raised,
            ``AttributeError`` included; it is never taken to mean "not distributed".
    """
    if isinstance(strategy, whitelisted):
        return True, WHITELISTED
    own = own_is_distributed(strategy)
    return (False, NEITHER) if own is None else (own, OWN_ATTRIBUTE)


def own_is_distributed(strategy: Any) -> Optional[bool]:
    """A strategy's own ``is_distributed`` answer, or ``None`` if it has no such attribute (step 2).

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
            return None  # no such attribute anywhere: step 3
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
