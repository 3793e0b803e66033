"""Moving a module to or from an XLA device without untying its shared (tied) parameters.

``module.to(device)`` between the CPU and an XLA device cannot hand a new tensor to the existing
``Parameter`` (the two tensor types are not shallow-copy compatible), so every submodule gets a new
``Parameter`` object of its own. A parameter two submodules share, such as a language model's output
layer tied to its embedding (``decoder.weight = embedding.weight``), becomes two parameters: the
model has one parameter more, and training updates the two copies apart. :func:`move_module` is the
one place the XLA strategies move a module; the mixins route Lightning's moves (Trainer setup and
teardown, Fabric's setup and ``to_device``) through it.

Ties are found and restored with Lightning's ``find_shared_parameters`` / ``set_shared_parameters``
(``lightning.pytorch.utilities``), which Lightning's own XLA Trainer strategies call around the
move at setup (Lightning issue #2705). They are public in both packagings (``lightning.pytorch``
and ``pytorch_lightning``); ``lightning.fabric``/``lightning_fabric`` have no counterpart, but the
plugin's Fabric strategies import ``lightning.pytorch`` already (``lightning`` is a dependency of
the plugin), so the one helper serves both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional, Union

import torch
from lightning.pytorch.utilities import find_shared_parameters, set_shared_parameters
from torch import Tensor
from torch.nn import Module

_CPU = torch.device("cpu")


def move_module(
    module: Module, device: Union[torch.device, str], convert: Optional[Callable[[Tensor], Tensor]] = None
) -> Module:
    """Move ``module`` to ``device`` in place (``module.to(device)``), keeping every tie; return it.

    Each group of submodule attributes that held one ``Parameter`` before the move holds one again
    afterwards (the moved parameter of the group's first name, in ``module.named_parameters()``
    order), so ``len(list(module.parameters()))`` does not change.

    Args:
        module: the module to move; may hold tied parameters.
        device: the target device (an XLA device, or the CPU at teardown).
        convert: how each parameter and buffer reaches ``device``, in place of ``tensor.to(device)``
            (the sharded strategies gather sharded tensors through cached graphs); applied with
            ``Module._apply``, the mechanism behind ``Module.to``.
    """
    shared = find_shared_parameters(module)
    if convert is None:
        module.to(device)
    else:
        module._apply(convert)
    if shared:
        set_shared_parameters(module, shared)
    return module


class MovesModelKeepingTies:
    """Mixin for Trainer strategies: setup moves the model with :func:`move_module`, and so does teardown.

    Lightning's ``Strategy.teardown`` moves the LightningModule back to the CPU with
    ``module.cpu()``, which unties its shared parameters (Lightning's XLA strategies restore ties
    only at setup), so a second ``fit`` of the same model trained two separate weights. Here the
    module goes to the CPU through :func:`move_module` first; Lightning's own move then finds it
    there and changes nothing.
    """

    model: Any
    lightning_module: Any
    root_device: Any

    def model_to_device(self) -> None:
        """Move the model to the root device, keeping its ties (:func:`move_module`)."""
        assert self.model is not None
        move_module(self.model, self.root_device)

    def teardown(self) -> None:
        """Move the LightningModule to the CPU, keeping its ties, then tear down as Lightning does."""
        if self.lightning_module is not None:
            move_module(self.lightning_module, _CPU)
        super().teardown()  # type: ignore[misc]


class MovesModuleKeepingTies:
    """Mixin for Fabric strategies: ``module_to_device`` (``fabric.setup*``, ``fabric.to_device``) keeps ties.

    Replaces Lightning's ``module.to(root_device)`` by :func:`move_module`; placed after the mixins
    that wrap the move (seeding, optimizer re-pointing), which call it through ``super()``.
    """

    root_device: Any

    def module_to_device(self, module: Module) -> None:
        """Move ``module`` to the root device, keeping its ties (:func:`move_module`)."""
        move_module(module, self.root_device)
