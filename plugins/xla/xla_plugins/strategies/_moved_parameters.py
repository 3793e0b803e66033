"""Keeping Fabric's optimizers on the parameters of a module moved to an XLA device."""

from __future__ import annotations

from torch.nn import Module
from torch.optim import Optimizer
from torch.utils.weak import WeakIdKeyDictionary


class KeepsOptimizersOnMovedParameters:
    """Mixin for Fabric strategies that move modules to XLA themselves.

    Moving a module to an XLA device replaces its ``Parameter`` objects (XLA tensors cannot take
    over a CPU tensor's storage), so an optimizer built on the CPU parameters would step tensors the
    model no longer uses: the run would go on without training. Fabric repairs the references only
    for Lightning's multi-device ``XLAStrategy`` (and refuses ``setup_optimizers`` there). This
    mixin records which new parameter replaced which old one in :meth:`module_to_device` (weakly:
    the old ones are freed once no optimizer holds them) and points every optimizer at the new ones,
    in ``fabric.setup(model, optimizer)`` and in ``fabric.setup_optimizers(optimizer)`` after
    ``fabric.setup_module(model)``. An optimizer created from the set-up module's parameters needs
    nothing. An optimizer still holding a parameter that is not on an XLA device afterwards fails
    loudly (:meth:`setup_optimizer`). The move itself is the next ``module_to_device`` in the MRO
    (:class:`~xla_plugins.strategies._tied_parameters.MovesModuleKeepingTies`, which keeps tied
    parameters tied, so an optimizer sees a tied parameter once before and after).
    """

    def _replacements(self) -> WeakIdKeyDictionary:
        return self.__dict__.setdefault("_replaced_parameters", WeakIdKeyDictionary())

    def module_to_device(self, module: Module) -> None:
        """Move ``module`` (the next ``module_to_device`` in the MRO), remembering which parameter replaced which.

        Every name of a tied parameter is looked at, so an optimizer holding the tied parameter once
        holds the moved one once.
        """
        before = dict(module.named_parameters(remove_duplicate=False))
        super().module_to_device(module)  # type: ignore[misc]
        after = dict(module.named_parameters(remove_duplicate=False))
        replaced = self._replacements()
        for name, old in before.items():
            if after[name] is not old:
                replaced[old] = after[name]

    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        """Point ``optimizer`` at the moved parameters (and their state), then check they are on XLA.

        Raises:
            RuntimeError: a parameter of ``optimizer`` is not on an XLA device: it belongs to no
                module set up by this strategy, and stepping it would not train the model.
        """
        replaced = self._replacements()
        for group in optimizer.param_groups:
            group["params"] = [replaced.get(parameter, parameter) for parameter in group["params"]]
        for old in [key for key in optimizer.state if key in replaced]:
            optimizer.state[replaced[old]] = optimizer.state.pop(old)
        stale = [p for group in optimizer.param_groups for p in group["params"] if p.device.type != "xla"]
        if stale:
            raise RuntimeError(
                f"{type(optimizer).__name__} holds {len(stale)} parameter(s) on {stale[0].device}, not on the XLA"
                f" device: they belong to no module set up with this Fabric, so stepping it would not train the"
                " model. Set the module up first (`fabric.setup_module(model)` or `fabric.setup(model, optimizer)`)"
                " and build the optimizer from the same module."
            )
        return super().setup_optimizer(optimizer)  # type: ignore[misc]
