"""Lightning's strategies on the ``"tpu"`` device: single device, DDP over ``"tpu_dist"`` without device ids, FSDP2.

* :mod:`~torchtpu_plugins.strategies.single_device`, :mod:`~torchtpu_plugins.strategies.ddp` (also
  ``ddp_spawn``), :mod:`~torchtpu_plugins.strategies.fsdp`: the Trainer's and Fabric's strategies;
* ``_on_tpu``: what each of them changes in Lightning's for the ``"tpu"`` device (the bound device,
  the process-group start, moves that keep parameter objects, CPU checkpoints);
* ``_process_groups``: the ``"tpu_dist"`` group beside a launcher's group that has none.

Every strategy here writes CPU tensors into Trainer checkpoints: a tensor saved from ``"tpu"`` keeps
that device, a machine without torch_tpu cannot load it, and Lightning's default ``map_location``
does not remap ``"tpu"``. The copy is made on every rank before rank 0 writes (a host read on some
ranks only can stall a TorchTPU mesh; not verified on TPU).

DDP runs one process per chip, as TorchTPU does. Only what the ``"tpu"`` device changes is replaced:

* the root device is the one this process is bound to, ``torch.accelerator.current_device_index()``
  (TorchTPU binds each process to one index; sources disagree on which, so it is read, never derived
  from ``LOCAL_RANK``);
* DDP gets no ``device_ids``: Lightning 2.6 passes ``[index]`` for every non-CPU device and then opens
  ``torch.cuda.Stream()`` around the wrapping, which fails without CUDA; TorchTPU's DDP runs without them;
* the process group is initialised without ``device_id``: Lightning 2.6 passes the root device, and
  torch then asks the group for a backend bound to that device, which a ``"tpu_dist"`` group written
  in Python (the stand-in's) does not have. TorchTPU's own examples initialise ``"tpu_dist"`` without it.

A default group that a launcher made before the strategy starts (Ray Train's ``TorchTrainer``:
``"gloo"`` on workers without a ``TPU`` resource) has no backend for ``"tpu"``: beside it, DDP and the
strategy's reductions and gathers over the world run on a second group of the same ranks on
``"tpu_dist"`` (:mod:`torchtpu_plugins.strategies._process_groups`), destroyed at teardown.

The process-group backend is Lightning's rule unchanged: ``torch.distributed``'s device-to-backend map,
where TorchTPU (and the stand-in) map ``"tpu"`` to ``"tpu_dist"``.

Processes an outside launcher started (torchrun, Ray Train, srun; the cluster environment's
``creates_processes_externally``) are taken as they are: no process is started, the world size and
the ranks are the launcher's, and a process group that already exists (Ray Train initialises one
before the user's function runs) is reused with its own backend, once its world size and this
process's rank agree with the cluster environment's.

Fully sharded training is Lightning's own FSDP2 path, its ``ModelParallelStrategy`` (torch's
``fully_shard`` on a ``DeviceMesh("tpu")``), with the bound device and the process group as for DDP, and
a one-dimensional data-parallel mesh over every process (Lightning's default puts the processes of a
host on its tensor-parallel dimension). A module that shards itself in ``configure_model`` (Trainer)
or a ``parallelize_fn`` (Fabric) keeps its sharding; otherwise :func:`shard_each_child` shards it.

The Trainer strategies run long runs with the core's mixins (:mod:`trainer_plugins.long_runs`): a stop
signal writes a checkpoint that ``ckpt_path="last"`` resumes exactly, DDP's processes agreeing on the
stop over the ``"tpu_dist"`` group; checkpoints are written atomically, in a background thread.
"""
