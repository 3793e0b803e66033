"""What the fully sharded strategies add to the SPMD ones: the FSDP mesh, wrapping by policy, the checkpoint format.

:class:`_ShardsParameters` is the base of both flavours of ``xla_fsdp_v2``
(:mod:`xla_plugins.strategies.xla_fsdp_v2`), placed before the SPMD strategy of the flavour; the
``check_*`` functions validate its options, as Lightning's FSDP strategies name them;
:func:`gather_full` gathers sharded tensors for the full checkpoint format.
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Union

import torch
from lightning.fabric.utilities.types import _PATH
from lightning_utilities import apply_to_collection
from torch import Tensor
from torch.nn import Module

from trainer_plugins.long_runs import _commits
from xla_plugins.checkpoints._sharded_checkpoints import save_sharded
from xla_plugins.runtime import _torch_xla_contract
from xla_plugins.runtime._silenced_warnings import BACKWARD_BARRIER, silenced
from xla_plugins.strategies._tied_parameters import move_module

#: Mesh axis the parameters are sharded over (torch_xla's SPMD FSDP requires this name).
FSDP_AXIS = "fsdp"
#: Default name of the second axis of a 2-D (hybrid) mesh: the batch is sharded over it and
#: ``"fsdp"``; parameters are replicated along it.
HYBRID_DATA_AXIS = "data"
#: Checkpoint formats, as Lightning's FSDP strategies name them.
STATE_DICT_TYPES = ("full", "sharded")
_WRAPPED = _torch_xla_contract.FSDP_V2_WRAPPED_MODULE.name + "."


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


def gather_full(state: Any, mesh: Any) -> Any:
    """``state`` (any collection) with each sharded XLA tensor replaced by the full tensor on the CPU.

    Each tensor is replicated over ``mesh`` by a graph of its own (a copy marked replicated with
    ``xs.mark_sharding``; XLA's partitioner inserts the all-gather), then read back. The graph
    depends only on the tensor's shape, dtype and sharding, so torch_xla's graph cache serves
    every later checkpoint of the same state: nothing is compiled again. torch_xla's own transfer
    of a sharded tensor (``_xla_get_cpu_tensors``, which Lightning's ``XLACheckpointIO`` uses)
    compiles a new replicating program for every tensor on every call. One tensor is gathered at a
    time, so a device holds at most one full tensor beyond its shards. Replicated, unsharded and
    non-XLA tensors, and everything else, are returned as they are.

    Every host must call it (each runs the same graphs, as SPMD requires).
    """
    return apply_to_collection(state, Tensor, gather_tensor, mesh)


def gather_tensor(tensor: Tensor, mesh: Any) -> Tensor:
    """``tensor`` on the CPU if it is a sharded XLA tensor (gathered as :func:`gather_full` does), else ``tensor``."""
    import torch_xla.distributed.spmd as xs

    if tensor.device.type != "xla" or tensor.dim() == 0:
        return tensor
    if _torch_xla_contract.sharding_spec(tensor) in ("", "{replicated}"):
        return tensor
    with torch.no_grad():
        copy = tensor * tensor.new_ones(())  # a new value of the same dtype (bool too) to mark replicated
    xs.mark_sharding(copy, mesh, (None,) * copy.dim())
    return copy.cpu()


def to_host(tensor: Tensor, mesh: Any) -> Tensor:
    """``tensor`` on the CPU: sharded ones through :func:`gather_tensor`'s cached graphs, others with ``.cpu()``."""
    return gather_tensor(tensor, mesh).cpu()


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


class _ShardsParameters:
    """What both flavours add to the SPMD strategies: the FSDP mesh, wrapping, checkpoint format.

    Keyword arguments: see :class:`~xla_plugins.strategies.xla_fsdp_v2.XLAFSDPv2Strategy`; the rest go to the
    SPMD strategy.
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

    def backward(self, *args: Any, **kwargs: Any) -> Any:
        """The backward pass of the Trainer's or Fabric's strategy, without torch's warning about torch_xla's
        backward barrier hook at every step (see :mod:`xla_plugins.runtime._silenced_warnings`)."""
        with silenced(BACKWARD_BARRIER):
            return super().backward(*args, **kwargs)  # type: ignore[misc]

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

    def _place_module(self, module: Module) -> Module:
        """Move ``module`` to the device, apply activation checkpointing, wrap it (and by policy its children).

        Returns the root ``SpmdFullyShardedDataParallel``; ``module`` keeps its parameter objects,
        now sharded along ``"fsdp"`` (torch_xla shards each parameter's largest dimension).
        State dicts of the wrappers carry the user's names: hooks drop the wrappers' ``_orig_module.``.
        """
        from torch_xla.distributed.fsdp import checkpoint_module
        from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy
        from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2

        move_module(module, self.root_device)  # tied parameters stay tied (one parameter, sharded once)
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
        # the wrapper moved it to device 'xla'; device properties name xla:0 again
        move_module(module, self.root_device)
        return wrapper

    def _save_sharded(self, path: _PATH, tensors: dict[str, Any], metadata: dict[str, Any]) -> None:
        """Write a sharded checkpoint; every host takes part (metadata and the commit on global rank 0).

        Through the checkpoint IO's ``save_sharded`` when it has one (the default's: in the background
        with :class:`~xla_plugins.checkpoints.checkpoint_io.BackgroundXLACheckpointIO`, which needs the hosts to
        meet again only when a checkpoint is loaded), else on this thread (:func:`save_sharded`),
        followed by a barrier. Every host writes into global rank 0's temporary directory.
        """
        metadata["__sharded_keys__"] = sorted(tensors)
        io = self.checkpoint_io  # type: ignore[attr-defined]
        save = getattr(io, "save_sharded", None)
        background = callable(save) and callable(getattr(io, "wait", None))
        staging = self.broadcast(_commits.temporary_path(path))  # type: ignore[attr-defined]
        options = {"staging": staging, "process_group": self._writer_group() if background else None}
        if callable(save):
            save(path, tensors, metadata if self.is_global_zero else None, **options)  # type: ignore[attr-defined]
        else:
            save_sharded(path, tensors, metadata, write_metadata=self.is_global_zero, **options)  # type: ignore[attr-defined]
        if not background:
            self.barrier("xla_plugins.save_sharded")  # type: ignore[attr-defined]

    def _writer_group(self) -> Optional[Any]:
        """On several hosts, a process group of the background writes' own (``None`` on one host).

        A writer thread's collectives must not interleave with the training thread's on the default
        group; torch_xla's ``CheckpointManager`` makes a group of its own for its writes alike. Made on
        the training thread at the first sharded save, which every host makes.
        """
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None
        if getattr(self, "_writes_group", None) is None:
            self._writes_group = dist.new_group(backend="gloo")
        return self._writes_group

    def _unwrap(self) -> None:
        """Put the wrapped children and un-checkpointed forwards back, so the user's module is plain again."""
        for parent, name, child in reversed(self._wrapped):
            setattr(parent, name, child)
        for child in self._checkpointed:
            for attribute in ("forward", *(name.name for name in _torch_xla_contract.CHECKPOINTED_FORWARDS)):
                child.__dict__.pop(attribute, None)
        self._wrapped.clear()
        self._checkpointed.clear()
