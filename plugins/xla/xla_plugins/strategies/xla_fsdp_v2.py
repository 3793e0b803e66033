"""Fully sharded data parallelism over a mesh through SPMD (torch_xla's "FSDPv2"), for the Trainer and Fabric.

The strategies extend the SPMD data-parallel ones (:mod:`xla_plugins.strategies.xla_spmd`: one
process, SPMD mode, the mesh, batch meaning, one-process collectives) with parameter sharding:
the module is wrapped in torch_xla's
``torch_xla.experimental.spmd_fully_sharded_data_parallel.SpmdFullyShardedDataParallel``, which
shards every parameter along the mesh axis ``"fsdp"``; gradients and optimizer state follow the
parameters' sharding, and XLA's partitioner inserts the all-gathers and reduce-scatters.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Optional, Union

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import find_shared_parameters, set_shared_parameters
from lightning_utilities import apply_to_collection
from torch import Tensor
from torch.nn import Module
from torch.optim import Optimizer
from typing_extensions import override

from xla_plugins.strategies import _batches
from xla_plugins.strategies.xla_spmd import FabricXLASPMDStrategy, XLASPMDStrategy

#: Mesh axis the parameters are sharded over (torch_xla's SPMD FSDP requires this name).
FSDP_AXIS = "fsdp"
#: Default name of the second axis of a 2-D (hybrid) mesh: the batch is sharded over it and
#: ``"fsdp"``; parameters are replicated along it.
HYBRID_DATA_AXIS = "data"
#: Checkpoint formats, as Lightning's FSDP strategies name them.
STATE_DICT_TYPES = ("full", "sharded")
#: File of a sharded checkpoint directory holding everything but the tensors of modules and optimizers.
METADATA_FILE = "meta.pt"
_WRAPPED = "_orig_module."


def check_mesh(mesh_shape: Any, axis_names: Any) -> tuple[Optional[tuple[int, ...]], tuple[str, ...]]:
    """Validate the mesh options; return ``(shape or None, axis names)``.

    Args:
        mesh_shape: ``None`` (a 1-D mesh over all devices), ``(n,)``, or ``(d, n)`` for a 2-D mesh
            of ``d`` data-parallel groups of ``n`` devices each sharding the parameters (hybrid).
        axis_names: ``None`` (``("fsdp",)`` or ``("data", "fsdp")`` by the shape), or a tuple of one
            name per dimension whose last is ``"fsdp"`` (torch_xla's SPMD FSDP shards over the axis
            of that name; the first axis of a 2-D mesh is the extra data axis).

    Raises:
        ValueError: a shape that is not one or two positive ints, or names that do not fit it.
    """
    shape: Optional[tuple[int, ...]] = None
    if mesh_shape is not None:
        valid = (
            isinstance(mesh_shape, (tuple, list))
            and len(mesh_shape) in (1, 2)
            and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in mesh_shape)
        )
        if not valid:
            raise ValueError(
                f"`mesh_shape={mesh_shape!r}` is not a mesh shape. Choose None (a 1-D mesh over all devices),"
                " (devices,) or (data, fsdp) with positive ints whose product is the device count."
            )
        shape = tuple(mesh_shape)
    rank = len(shape) if shape is not None else (len(axis_names) if isinstance(axis_names, (tuple, list)) else 1)
    default = (FSDP_AXIS,) if rank == 1 else (HYBRID_DATA_AXIS, FSDP_AXIS)
    names = default if axis_names is None else axis_names
    ok = (
        isinstance(names, (tuple, list))
        and len(names) == rank
        and all(isinstance(n, str) and n for n in names)
        and names[-1] == FSDP_AXIS
        and len(set(names)) == len(names)
    )
    if not ok or rank not in (1, 2):
        raise ValueError(
            f"`axis_names={axis_names!r}` does not fit `mesh_shape={mesh_shape!r}`. Choose one distinct name per mesh"
            f" dimension, the last one {FSDP_AXIS!r}: ({FSDP_AXIS!r},) for a 1-D mesh, for example"
            f" ({HYBRID_DATA_AXIS!r}, {FSDP_AXIS!r}) for a 2-D one."
        )
    return shape, tuple(names)


def check_state_dict_type(state_dict_type: Any) -> str:
    """Return ``state_dict_type`` if it is one of :data:`STATE_DICT_TYPES` (Lightning's FSDP names).

    Raises:
        ValueError: anything else, naming the value and the valid choices.
    """
    if isinstance(state_dict_type, str) and state_dict_type in STATE_DICT_TYPES:
        return state_dict_type
    raise ValueError(
        f"`state_dict_type={state_dict_type!r}` is not a checkpoint format. Choose one of"
        f" {', '.join(map(repr, STATE_DICT_TYPES))}."
    )


def check_policy(policy: Any, name: str, callable_ok: bool) -> Any:
    """Return ``policy`` as a set of module classes, a callable (if ``callable_ok``) or ``None``.

    Mirrors Lightning's FSDP strategies: a policy is a set (or list, tuple) of ``nn.Module``
    subclasses; ``auto_wrap_policy`` may also be a callable of torch_xla's auto-wrap signature
    ``(module, recurse, unwrapped_params) -> bool``.

    Raises:
        TypeError: anything else, naming the value and the valid choices.
    """
    if policy is None:
        return None
    if isinstance(policy, (set, frozenset, list, tuple)) and policy:
        if all(isinstance(c, type) and issubclass(c, Module) for c in policy):
            return set(policy)
    elif callable_ok and callable(policy) and not isinstance(policy, type):
        return policy
    choices = "None, a set of nn.Module subclasses" + (
        " or a callable (module, recurse, unwrapped_params)" if callable_ok else ""
    )
    raise TypeError(f"`{name}={policy!r}` is not a policy. Choose {choices}.")


def _strip_wrapper_names(module: Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    """State-dict post-hook of a wrapper: ``<prefix>_orig_module.<rest>`` becomes ``<prefix><rest>`` (order kept)."""
    inner = prefix + _WRAPPED
    for key in [k for k in state_dict if k.startswith(inner)]:
        state_dict[prefix + key[len(inner) :]] = state_dict.pop(key)


def _add_wrapper_names(module: Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """Load pre-hook of a wrapper: ``<prefix><rest>`` is looked up as ``<prefix>_orig_module.<rest>``."""
    inner = prefix + _WRAPPED
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(inner)]:
        state_dict[inner + key[len(prefix) :]] = state_dict.pop(key)


def shard_optimizer_state(optimizers: Iterable[Optimizer]) -> None:
    """Give each optimizer state tensor shaped like its parameter the parameter's sharding.

    A state loaded from a consolidated checkpoint arrives as full tensors, replicated on every
    device; this puts it back to 1/N per device, as torch_xla's ``prime_optimizer`` shards gradients.
    """
    import torch_xla

    for optimizer in optimizers:
        for parameter, state in optimizer.state.items():
            sharding = torch_xla._XLAC._get_xla_op_sharding(parameter)
            if not sharding:
                continue
            for value in state.values():
                same = isinstance(value, Tensor) and value.device.type == "xla" and value.shape == parameter.shape
                if same and not torch_xla._XLAC._get_xla_sharding_spec(value):
                    torch_xla._XLAC._xla_mark_sharding(value, sharding)


def save_sharded(path: _PATH, tensors: dict[str, Any], metadata: dict[str, Any], write_metadata: bool = True) -> None:
    """Write a sharded checkpoint: the directory ``path`` holding ``tensors`` and ``metadata``.

    Tensors go through ``torch.distributed.checkpoint`` with torch_xla's ``SPMDSavePlanner`` (each
    device's shards, nothing gathered; on several hosts each writes its own, coordinated by the
    process group the SPMD strategies join there); ``metadata`` (anything ``torch.save`` takes) goes
    to :data:`METADATA_FILE` when ``write_metadata`` (on global rank 0 only).
    """
    import torch.distributed.checkpoint as dcp
    import torch_xla
    from torch_xla.experimental.distributed_checkpoint import SPMDSavePlanner

    torch_xla.sync()
    Path(path).mkdir(parents=True, exist_ok=True)
    dcp.save(tensors, storage_writer=dcp.FileSystemWriter(str(path)), planner=SPMDSavePlanner())
    if write_metadata:
        torch.save(metadata, os.path.join(path, METADATA_FILE))


def is_sharded_checkpoint(path: _PATH) -> bool:
    """Whether ``path`` is a directory written by :func:`save_sharded`."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, METADATA_FILE))


def load_sharded(path: _PATH, modules: dict[str, Module], optimizers: dict[str, Optimizer]) -> dict[str, Any]:
    """Load a :func:`save_sharded` checkpoint in place into sharded ``modules`` and ``optimizers``; return its metadata.

    Optimizers without state are primed first (torch_xla's ``prime_optimizer``: one step with zero
    gradients), since torch.distributed.checkpoint loads into existing tensors.

    Raises:
        KeyError: a module's or optimizer's key is not in the checkpoint (naming it and those present).
    """
    import torch.distributed.checkpoint as dcp
    from torch_xla.experimental.distributed_checkpoint import SPMDLoadPlanner, prime_optimizer

    metadata = torch.load(os.path.join(path, METADATA_FILE), map_location="cpu", weights_only=False)
    stored = set(metadata.get("__sharded_keys__", ()))
    missing = [key for key in (*modules, *optimizers) if key not in stored]
    if missing:
        raise KeyError(f"The sharded checkpoint {str(path)!r} has no {missing[0]!r}; it holds {sorted(stored)}.")
    for optimizer in optimizers.values():
        if not optimizer.state:
            prime_optimizer(optimizer)
    target: dict[str, Any] = {key: module.state_dict() for key, module in modules.items()}
    target.update({key: optimizer.state_dict() for key, optimizer in optimizers.items()})
    dcp.load(target, storage_reader=dcp.FileSystemReader(str(path)), planner=SPMDLoadPlanner())
    for key, module in modules.items():
        module.load_state_dict(target[key])
    for key, optimizer in optimizers.items():
        optimizer.load_state_dict(target[key])
    metadata.pop("__sharded_keys__", None)
    return metadata


class _ShardsParameters:
    """What both flavours add to the SPMD strategies: the FSDP mesh, wrapping, checkpoint format.

    Keyword arguments: see :class:`XLAFSDPv2Strategy`; the rest go to the SPMD strategy.
    """

    lightning_module: Any
    root_device: torch.device
    _mesh: Any
    _log_name = "xla_fsdp_v2"

    def __init__(
        self,
        *,
        mesh_shape: Optional[tuple[int, ...]] = None,
        axis_names: Optional[tuple[str, ...]] = None,
        auto_wrap_policy: Any = None,
        activation_checkpointing_policy: Any = None,
        state_dict_type: str = "full",
        **kwargs: Any,
    ) -> None:
        self.mesh_shape, self.axis_names = check_mesh(mesh_shape, axis_names)
        self.auto_wrap_policy = check_policy(auto_wrap_policy, "auto_wrap_policy", callable_ok=True)
        self.activation_checkpointing_policy = check_policy(
            activation_checkpointing_policy, "activation_checkpointing_policy", callable_ok=False
        )
        self.state_dict_type = check_state_dict_type(state_dict_type)
        self._wrapped: list[tuple[Module, str, Module]] = []
        self._checkpointed: list[Module] = []
        super().__init__(**kwargs)

    def _build_mesh(self, count: int) -> Any:
        """The mesh of ``mesh_shape`` (default ``(count,)``) and ``axis_names`` over ``count`` devices.

        Raises:
            ValueError: the shape's product is not ``count``, naming both and the valid shapes.
        """
        import numpy as np
        import torch_xla.distributed.spmd as xs

        shape = self.mesh_shape or (count,)
        if int(np.prod(shape)) != count:
            pairs = ", ".join(f"({d}, {count // d})" for d in range(1, count + 1) if count % d == 0)
            raise ValueError(
                f"`mesh_shape={shape!r}` needs {int(np.prod(shape))} devices, but the run has {count}."
                f" Choose None or ({count},) for a 1-D mesh, or one of {pairs} for a 2-D (data, fsdp) mesh."
            )
        return xs.Mesh(np.arange(count), shape, self.axis_names)

    @property
    def batch_axes(self) -> Union[str, tuple[str, ...]]:
        """The batch's first dimension is sharded over every mesh axis: ``"fsdp"``, or ``("data", "fsdp")``."""
        return self.axis_names if len(self.axis_names) > 1 else FSDP_AXIS

    def _shard_output(self, output: Any, mesh: Any) -> None:
        """Shard the first dimension of each tensor of ``output`` over :attr:`batch_axes` (scalars stay replicated).

        torch_xla's default shards only the first tensor of a tensor or tuple; a LightningModule's
        steps return dicts and scalars too.
        """
        import torch_xla.distributed.spmd as xs

        def shard(tensor: Tensor) -> None:
            if tensor.dim() > 0 and tensor.device.type == "xla":
                xs.mark_sharding(tensor, mesh, (self.batch_axes,) + (None,) * (tensor.dim() - 1))

        apply_to_collection(output, Tensor, shard)

    def _wrap(self, module: Module) -> Module:
        """Move ``module`` to the device, apply activation checkpointing, wrap it (and by policy its children).

        Returns the root ``SpmdFullyShardedDataParallel``; ``module`` keeps its parameter objects,
        now sharded along ``"fsdp"`` (torch_xla shards each parameter's largest dimension).
        State dicts of the wrappers carry the user's names: hooks drop the wrappers' ``_orig_module.``.
        """
        from torch_xla.distributed.fsdp import checkpoint_module
        from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy
        from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2

        shared = find_shared_parameters(module)
        module.to(self.root_device)
        set_shared_parameters(module, shared)
        if self.activation_checkpointing_policy:
            for child in module.modules():
                if isinstance(child, tuple(self.activation_checkpointing_policy)) and child is not module:
                    checkpoint_module(child)
                    self._checkpointed.append(child)
        policy = self.auto_wrap_policy
        if isinstance(policy, set):
            policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=policy)
        parents = {id(child): (parent, name) for parent in module.modules() for name, child in parent.named_children()}
        wrapper = FSDPv2(module, mesh=self._mesh, shard_output=self._shard_output, auto_wrap_policy=policy)
        for each in wrapper.modules():
            if isinstance(each, FSDPv2):
                each.register_state_dict_post_hook(_strip_wrapper_names)
                each.register_load_state_dict_pre_hook(_add_wrapper_names)
                if each is not wrapper:
                    parent, name = parents[id(each.module)]
                    self._wrapped.append((parent, name, each.module))
        module.to(self.root_device)  # the wrapper moved it to device 'xla'; device properties name xla:0 again
        return wrapper

    def _unwrap(self) -> None:
        """Put the wrapped children and un-checkpointed forwards back, so the user's module is plain again."""
        for parent, name, child in reversed(self._wrapped):
            setattr(parent, name, child)
        for child in self._checkpointed:
            for attribute in ("forward", "_xla_checkpointed_forward_original", "_xla_checkpointed_forward_no_kwargs"):
                child.__dict__.pop(attribute, None)
        self._wrapped.clear()
        self._checkpointed.clear()


class XLAFSDPv2Strategy(_ShardsParameters, XLASPMDStrategy):  # type: ignore[misc]
    """Fully sharded data parallelism on XLA through SPMD, for the Trainer (``"xla_fsdp_v2"``).

    The model is wrapped in torch_xla's ``SpmdFullyShardedDataParallel`` ("FSDPv2"): every parameter
    is sharded along the mesh axis ``"fsdp"`` (its largest dimension split N ways), gradients and
    optimizer state follow, so each device holds about 1/N of them; XLA's SPMD partitioner inserts
    the all-gathers of the forward and backward passes and the gradients' reduce-scatters. All of
    :class:`~xla_plugins.strategies.xla_spmd.XLASPMDStrategy` holds: one process, ``world_size``
    1, the loader's batch per device by default (``batch``), the batch sharded over every mesh
    axis, ``sync_dist`` and collectives returning global values, the device RNG seeded at setup.
    Every tensor is global in SPMD, so gradient clipping by norm (Lightning's
    ``torch.nn.utils.clip_grad_norm_``) computes the norm of the whole, unsharded gradient.

    Checkpoints (``trainer.save_checkpoint``, ``ModelCheckpoint``): ``state_dict_type="full"`` (the
    default) writes one file of full CPU tensors under the user's parameter names, loadable with
    ``torch.load`` into the plain module without torch_xla; ``"sharded"`` writes a directory:
    each device's shards through ``torch.distributed.checkpoint`` with torch_xla's
    ``SPMDSavePlanner``, plus the rest in ``meta.pt`` (Lightning's FSDP names both formats alike).
    ``fit(ckpt_path=...)`` reads either, after the model is wrapped (as Lightning's FSDP strategy),
    and restores the optimizer state sharded like the parameters.

    Args:
        mesh_shape: ``None`` (a 1-D mesh over all devices, the default), ``(n,)``, or ``(d, n)``: a
            2-D mesh of ``d`` groups of ``n`` devices, parameters sharded within a group and
            replicated across groups (hybrid sharding, e.g. one group per TPU host).
        axis_names: one name per mesh dimension, the last ``"fsdp"``; default ``("fsdp",)`` or
            ``("data", "fsdp")``.
        auto_wrap_policy: ``None``, a set of ``nn.Module`` classes whose instances are wrapped (and
            so gathered) one by one, as in Lightning's FSDP strategies, or a callable of torch_xla's
            auto-wrap signature.
        activation_checkpointing_policy: ``None`` or a set of ``nn.Module`` classes whose forward is
            recomputed in backward (torch_xla's ``checkpoint_module``).
        state_dict_type: ``"full"`` (default) or ``"sharded"``.
        batch: ``"per_device"`` (default) or ``"global"``: what the loader's batch is.
        accelerator, parallel_devices, cluster_environment, checkpoint_io, precision_plugin: as for
            Lightning's ``ParallelStrategy`` (keywords).

    Raises:
        ValueError: a bad ``mesh_shape``/``axis_names`` (also a shape whose product is not the device
            count, at setup), ``state_dict_type`` or ``batch``, each naming the valid choices.
        TypeError: a policy that is neither a set of module classes nor (auto-wrap) a callable.
        ModuleNotFoundError: torch_xla is not installed.
    """

    strategy_name = "xla_fsdp_v2"

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        assert self.accelerator is not None and self.model is not None
        self.accelerator.setup(trainer)
        self.precision_plugin.convert_module(self.model)
        self.model = self._wrap(self.model)
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING:
            _optimizers_to_device(self.optimizers, self.root_device)

    @override
    def model_to_device(self) -> None:
        assert self.model is not None
        self.model.to(self.root_device)

    @property
    @override
    def restore_checkpoint_after_setup(self) -> bool:
        """``True``: checkpoints load into the wrapped, sharded model (as Lightning's FSDP strategy)."""
        return True

    @property
    @override
    def lightning_restore_optimizer(self) -> bool:
        """``False``: :meth:`load_checkpoint` restores the optimizers itself (as Lightning's FSDP strategy)."""
        return False

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: _PATH, storage_options: Optional[Any] = None
    ) -> None:
        """Write ``checkpoint`` in the :attr:`state_dict_type` format (see the class docstring)."""
        if self.state_dict_type == "full":
            super().save_checkpoint(checkpoint, filepath, storage_options)
            return
        checkpoint = dict(checkpoint)
        tensors = {"state_dict": checkpoint.pop("state_dict")}
        if "optimizer_states" in checkpoint:
            tensors.update({f"optimizer_{i}": s for i, s in enumerate(checkpoint.pop("optimizer_states"))})
        checkpoint["__sharded_keys__"] = sorted(tensors)
        save_sharded(filepath, tensors, checkpoint, write_metadata=self.is_global_zero)
        self.barrier("xla_plugins.save_sharded")

    @override
    def load_checkpoint(self, checkpoint_path: _PATH, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Read a full or sharded checkpoint, loading the model and (when fitting) the optimizers into place.

        Raises:
            KeyError: fitting from a checkpoint without optimizer states (Lightning's message).
        """
        assert self.lightning_module is not None
        fitting = self.lightning_module.trainer.state.fn == TrainerFn.FITTING
        if is_sharded_checkpoint(checkpoint_path):
            optimizers = {f"optimizer_{i}": o for i, o in enumerate(self.optimizers)} if fitting else {}
            return load_sharded(checkpoint_path, {"state_dict": self.lightning_module}, optimizers)
        checkpoint = super().load_checkpoint(checkpoint_path, *args, **kwargs)
        self.lightning_module.load_state_dict(checkpoint["state_dict"], strict=self.lightning_module.strict_loading)
        if fitting and self.optimizers:
            if "optimizer_states" not in checkpoint:
                raise KeyError(
                    "Trying to restore optimizer state but checkpoint contains only the model."
                    " This is probably due to `ModelCheckpoint.save_weights_only` being set to `True`."
                )
            for optimizer, state in zip(self.optimizers, checkpoint["optimizer_states"], strict=False):
                optimizer.load_state_dict(state)
            _optimizers_to_device(self.optimizers, self.root_device)
            shard_optimizer_state(self.optimizers)
        return checkpoint

    @override
    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        """Nothing: :meth:`load_checkpoint` loaded the model into place."""

    @override
    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """Nothing: :meth:`load_checkpoint` loaded the optimizers into place."""

    @override
    def teardown(self) -> None:
        """Unwrap the module (the user's module is plain again, ready for another ``fit``/``test``), then tear down."""
        self._unwrap()
        if self.lightning_module is not None:
            self.model = self.lightning_module
        super().teardown()


class FabricXLAFSDPv2Strategy(_ShardsParameters, FabricXLASPMDStrategy):  # type: ignore[misc]
    """Fabric's counterpart of :class:`XLAFSDPv2Strategy` (``"xla_fsdp_v2"``; Fabric's ``"xla_fsdp"`` stays
    Lightning's strategy over torch_xla's older FSDP wrapper).

    ``fabric.setup(model, optimizer)`` works, as does ``fabric.setup_module(model)`` followed by
    ``fabric.setup_optimizers(optimizer)``: the wrapper keeps the module's parameter objects, and an
    optimizer built on the CPU parameters is pointed at the moved, sharded ones
    (:class:`~xla_plugins.strategies._moved_parameters.KeepsOptimizersOnMovedParameters`); one whose
    parameters belong to no set-up module raises ``RuntimeError``. ``fabric.clip_gradients`` clips
    by the norm of the whole gradient (tensors are global in SPMD). ``fabric.save`` writes full CPU
    tensors under the user's names by default, or with ``state_dict_type="sharded"`` a directory
    (see :class:`XLAFSDPv2Strategy`); ``fabric.load`` reads either into the set-up objects. With an
    ``auto_wrap_policy``, the set-up module's children of those classes stay wrapped (Fabric has no
    teardown); its state dict keeps the user's names.

    The arguments and the errors raised are those of :class:`XLAFSDPv2Strategy`, with Fabric's
    ``precision`` in place of ``precision_plugin``.
    """

    def __init__(
        self,
        accelerator: Optional[Any] = None,
        parallel_devices: Optional[list[torch.device]] = None,
        cluster_environment: Optional[Any] = None,
        checkpoint_io: Optional[Any] = None,
        precision: Optional[Any] = None,
        batch: str = _batches.PER_DEVICE,
        *,
        mesh_shape: Optional[tuple[int, ...]] = None,
        axis_names: Optional[tuple[str, ...]] = None,
        auto_wrap_policy: Any = None,
        activation_checkpointing_policy: Any = None,
        state_dict_type: str = "full",
    ) -> None:
        super().__init__(
            mesh_shape=mesh_shape,
            axis_names=axis_names,
            auto_wrap_policy=auto_wrap_policy,
            activation_checkpointing_policy=activation_checkpointing_policy,
            state_dict_type=state_dict_type,
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision=precision,
            batch=batch,
        )

    @override
    def setup_module(self, module: Module) -> Module:
        """Wrap ``module`` (see :meth:`_ShardsParameters._wrap`)."""
        return self._wrap(module)

    @override
    def save_checkpoint(
        self,
        path: _PATH,
        state: dict[str, Union[Module, Optimizer, Any]],
        storage_options: Optional[Any] = None,
        filter: Optional[dict[str, Callable[[str, Any], bool]]] = None,
    ) -> None:
        """Write ``state`` in the :attr:`state_dict_type` format; a ``filter`` applies to the full format only.

        Raises:
            ValueError: ``filter`` with the sharded format.
        """
        import torch_xla

        torch_xla.sync()
        if self.state_dict_type == "full":
            super().save_checkpoint(path, state, storage_options, filter)
            return
        if filter:
            raise ValueError("`filter` is not supported with `state_dict_type='sharded'`; use 'full' or no filter.")
        tensors = {k: v.state_dict() for k, v in state.items() if isinstance(v, (Module, Optimizer))}
        metadata = {k: v for k, v in state.items() if k not in tensors}
        metadata["__sharded_keys__"] = sorted(tensors)
        save_sharded(path, tensors, metadata, write_metadata=self.is_global_zero)
        self.barrier("xla_plugins.save_sharded")

    @override
    def load_checkpoint(
        self,
        path: _PATH,
        state: Optional[Union[Module, Optimizer, dict[str, Union[Module, Optimizer, Any]]]] = None,
        strict: bool = True,
        *args: Any,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Read a full or sharded checkpoint into ``state``'s modules and optimizers (Fabric's rules).

        Returns what the checkpoint holds beyond ``state``'s keys; plain values of ``state`` are replaced.

        Raises:
            KeyError: with ``strict``, a key of ``state`` missing from a sharded checkpoint.
        """
        if not is_sharded_checkpoint(path):
            remainder = super().load_checkpoint(path, state, strict, *args, **kwargs)
            objects = state.values() if isinstance(state, dict) else [state]
            shard_optimizer_state(o for o in objects if isinstance(o, Optimizer))
            return remainder
        if state is None or isinstance(state, (Module, Optimizer)):
            raise ValueError(
                "A sharded checkpoint loads into a dict of the set-up module and optimizers: `state={...}`."
            )
        modules = {k: v for k, v in state.items() if isinstance(v, Module)}
        optimizers = {k: v for k, v in state.items() if isinstance(v, Optimizer)}
        metadata = load_sharded(path, modules, optimizers)
        for key in [k for k in state if k not in modules and k not in optimizers]:
            if key in metadata:
                state[key] = metadata.pop(key)
            elif strict:
                raise KeyError(f"The sharded checkpoint {str(path)!r} has no {key!r}; it holds {sorted(metadata)}.")
        return metadata
