"""Keeping Fabric's optimizers on the parameters of a module moved to an XLA device."""

from __future__ import annotations

from typing import Any

from torch.nn import Module, Parameter


class KeepsOptimizersOnMovedParameters:
    """Mixin for Fabric strategies that move modules to XLA themselves.

    Moving a module to an XLA device replaces its ``Parameter`` objects (XLA tensors cannot take
    over a CPU tensor's storage), so an optimizer built on the CPU parameters would step tensors the
    model no longer uses. Fabric repairs the references only for Lightning's multi-device
    ``XLAStrategy``; this mixin does the same for the strategies that use it: it records which new
    parameter replaced which old one in :meth:`module_to_device` and points the optimizers at the new
    ones in :meth:`setup_module_and_optimizers`.
    """

    _replaced: dict[Parameter, Parameter]
    root_device: Any

    def module_to_device(self, module: Module) -> None:
        """Move ``module`` to ``root_device``, remembering which parameter replaced which."""
        before = dict(module.named_parameters())
        module.to(self.root_device)
        after = dict(module.named_parameters())
        self._replaced = {old: after[name] for name, old in before.items() if after[name] is not old}

    def setup_module_and_optimizers(self, module: Module, optimizers: list[Any], *args: Any, **kwargs: Any) -> Any:
        """Point ``optimizers`` at the moved parameters, then set up as the base strategy does.

        Extra arguments (the scheduler, since Lightning 2.6) are passed on unchanged.
        """
        replaced = getattr(self, "_replaced", {})
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                group["params"] = [replaced.get(parameter, parameter) for parameter in group["params"]]
        self._replaced = {}
        return super().setup_module_and_optimizers(module, optimizers, *args, **kwargs)  # type: ignore[misc]
