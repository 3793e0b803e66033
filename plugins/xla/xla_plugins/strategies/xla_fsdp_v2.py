"""Fully sharded data parallelism over a mesh through SPMD (torch_xla's "FSDPv2"), for the Trainer and Fabric.

The strategies extend the SPMD data-parallel ones (:mod:`xla_plugins.strategies.xla_spmd`: one
process, SPMD mode, the mesh, batch meaning, one-process collectives) with parameter sharding
(:mod:`xla_plugins.strategies._parameter_sharding`): the module is wrapped in torch_xla's
``torch_xla.experimental.spmd_fully_sharded_data_parallel.SpmdFullyShardedDataParallel``, which
shards every parameter along the mesh axis ``"fsdp"``; gradients and optimizer state follow the
parameters' sharding, and XLA's partitioner inserts the all-gathers and reduce-scatters.
Checkpoints are full or sharded (:mod:`xla_plugins.checkpoints._sharded_checkpoints`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Optional, Union

import torch
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.trainer.states import TrainerFn
from lightning_utilities import apply_to_collection
from torch import Tensor
from torch.nn import Module
from torch.optim import Optimizer
from typing_extensions import override

from xla_plugins.checkpoints._sharded_checkpoints import is_sharded_checkpoint, load_sharded, shard_optimizer_state
from xla_plugins.runtime._silenced_warnings import NON_TENSOR_OUTPUT, silenced
from xla_plugins.strategies import _batches
from xla_plugins.strategies._parameter_sharding import _ShardsParameters, gather_full, to_host
from xla_plugins.strategies._tied_parameters import move_module
from xla_plugins.strategies.xla_spmd import FabricXLASPMDStrategy, XLASPMDStrategy


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
    Both are written atomically, in the background by default, as the other XLA strategies' files
    (:class:`~xla_plugins.checkpoints._background_checkpoints.WritesCheckpointsInBackground`): the
    step waits for the copy of each device's shards to the host only.
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
    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        """Lightning's ``validation_step`` call, without torch's warning that the wrapper's backward hook cannot
        run on a step output that is no tensor (see :mod:`xla_plugins.runtime._silenced_warnings`)."""
        with silenced(NON_TENSOR_OUTPUT):
            return super().validation_step(*args, **kwargs)

    @override
    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        """Lightning's ``test_step`` call, without the warning :meth:`validation_step` silences."""
        with silenced(NON_TENSOR_OUTPUT):
            return super().test_step(*args, **kwargs)

    @override
    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        """Lightning's ``predict_step`` call, without the warning :meth:`validation_step` silences."""
        with silenced(NON_TENSOR_OUTPUT):
            return super().predict_step(*args, **kwargs)

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
        """Write ``checkpoint`` in the :attr:`state_dict_type` format (see the class docstring).

        The full format gathers each sharded tensor to the CPU first (:func:`gather_full`), so a repeated
        save of same-shaped state compiles nothing new.
        """
        if self.state_dict_type == "full":
            import torch_xla

            torch_xla.sync()
            super().save_checkpoint(gather_full(checkpoint, self._mesh), filepath, storage_options)
            return
        checkpoint = dict(checkpoint)
        tensors = {"state_dict": checkpoint.pop("state_dict")}
        if "optimizer_states" in checkpoint:
            tensors.update({f"optimizer_{i}": s for i, s in enumerate(checkpoint.pop("optimizer_states"))})
        self._save_sharded(filepath, tensors, checkpoint)
        self._wait_unless_a_loop_runs()

    @override
    def load_checkpoint(self, checkpoint_path: _PATH, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Read a full or sharded checkpoint, loading the model and (when fitting) the optimizers into place.

        Raises:
            KeyError: fitting from a checkpoint without optimizer states (Lightning's message).
        """
        assert self.lightning_module is not None
        self.wait_for_checkpoint_writes()  # a sharded one is read here, not through the checkpoint IO
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
        """Unwrap the module (the user's module is plain again, ready for another ``fit``/``test``), move its and
        the optimizers' sharded tensors to the CPU, then tear down.

        The move goes one tensor at a time through :func:`to_host`, whose graphs depend only on a
        tensor's shape, dtype and sharding: Lightning's own move (``module.cpu()``, then the
        optimizers' state) reads each sharded tensor with torch_xla's transfer, which compiled one
        program per tensor at every teardown (measured: 114 with the GPT example's 2 layers, now 10).
        """
        self._unwrap()
        module = self.lightning_module
        if module is not None:
            self.model = module
            if self._mesh is not None:
                convert = partial(to_host, mesh=self._mesh)
                move_module(module, torch.device("cpu"), convert)  # ties kept, as MovesModelKeepingTies does
                for optimizer in self.optimizers:
                    for parameter, state in list(optimizer.state.items()):
                        optimizer.state[parameter] = apply_to_collection(state, Tensor, convert)
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
        recompiles: Optional[str] = None,
    ) -> None:
        super().__init__(
            recompiles=recompiles,
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
        """Wrap ``module`` (:meth:`_ShardsParameters._place_module`), then set the wrapper up as ``xla_spmd`` does."""
        return super().setup_module(self._place_module(module))

    @override
    def get_module_state_dict(self, module: Module) -> dict[str, Any]:
        """``module``'s state dict; for the full format each sharded tensor gathered to the CPU (:func:`gather_full`).

        Fabric's ``save_checkpoint`` reads modules through it on every host before global rank 0 writes.
        """
        state = super().get_module_state_dict(module)
        return gather_full(state, self._mesh) if self.state_dict_type == "full" else state

    @override
    def get_optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        """``optimizer``'s state dict; for the full format with each sharded tensor gathered (:func:`gather_full`)."""
        state = super().get_optimizer_state(optimizer)
        return gather_full(state, self._mesh) if self.state_dict_type == "full" else state

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
        # other stateful objects (an LR scheduler, which holds the wrapped optimizer) are saved as their
        # state, as Fabric's own strategies save them; plain values as they are
        metadata = {k: v.state_dict() if _stateful(v) else v for k, v in state.items() if k not in tensors}
        self._save_sharded(path, tensors, metadata)

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

        Returns what the checkpoint holds beyond ``state``'s keys. Other objects of ``state`` with
        ``state_dict``/``load_state_dict`` (an LR scheduler) are restored in place, plain values replaced.

        Raises:
            KeyError: with ``strict``, a key of ``state`` missing from a sharded checkpoint.
        """
        self.wait_for_checkpoints_of_every_rank()  # a sharded one is read here, not through the checkpoint IO
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
            if key in metadata and _stateful(state[key]):
                state[key].load_state_dict(metadata.pop(key))  # restored in place, as Fabric does
            elif key in metadata:
                state[key] = metadata.pop(key)
            elif strict:
                raise KeyError(f"The sharded checkpoint {str(path)!r} has no {key!r}; it holds {sorted(metadata)}.")
        return metadata


def _stateful(value: Any) -> bool:
    """Whether ``value`` has ``state_dict`` and ``load_state_dict`` (Fabric's ``_Stateful`` protocol)."""
    return callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))
