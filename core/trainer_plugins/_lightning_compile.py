"""Lightning's check that a strategy can run a ``torch.compile``d LightningModule, knowing plugin strategies.

Part of the Lightning adapter (its twin serves ``pytorch_lightning``, see :mod:`trainer_plugins._standalone`);
:mod:`trainer_plugins._attach` points the trainer module's ``_verify_strategy_supports_compile`` here.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.utilities.compile import _verify_strategy_supports_compile

from trainer_plugins._names import plugin_strategy_names


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
        names = plugin_strategy_names(catalog, "trainer", claim.plugin, supports_compile=True)
        which = (
            f"of its strategies, {', '.join(map(repr, names))} {'runs' if len(names) == 1 else 'run'} a compiled"
            " module; pass the module uncompiled to the others"
            if names
            else "none of its strategies runs a compiled module; pass the module uncompiled"
        )
        raise RuntimeError(
            f"{error} Strategy {claim.entry.name!r} comes from plugin {claim.plugin.label}: {which}."
        ) from error
