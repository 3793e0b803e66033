"""The training loader's position in its epoch, kept in every checkpoint and restored when a fit resumes.

Lightning's fit loop saves the state of every training loader that has ``state_dict`` and
``load_state_dict`` (its stateful loader protocol, ``lightning.fabric.utilities.types._Stateful``)
under ``checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"]``, and gives it back to
the loader on a restart before iterating it (``_FitLoop.setup_data``; the same in Lightning 2.5 and
2.6). A backend's Trainer strategies give their training loader that protocol
(:class:`ResumesLoaderPosition` wraps it in a :class:`ResumableLoader`), so a resumed fit trains the
batches the run it continues had not trained, in the same order. In the file the positions stand
under their own key, :data:`CHECKPOINT_KEY` (:func:`portable`), and ``combined_loader`` holds what
plain Lightning writes there (the states of loaders that are stateful themselves): Lightning refuses
a checkpoint with more loader states than its loaders have, so otherwise a checkpoint of such a run
would not resume on another accelerator. What a position holds:

* **position**: the batches of the epoch that Lightning's loop has trained (its batch progress);
  on resume they are skipped. A ``DataLoader`` over a map-style dataset without workers skips their
  sampler indices (no data is loaded: torch's iterator draws them from ``_sampler_iter``); with
  workers, over an ``IterableDataset``, or for another iterable, they are loaded again and dropped
  (the device never sees them), so the workers' random streams and the iterable's order are those
  of the uninterrupted run. An iterable that is not a ``DataLoader`` may not yield the same batches
  again: that resume warns once (:class:`InexactResumeWarning`).
* **order**: the host's random states (:mod:`trainer_plugins.long_runs._rng_states`) when the epoch's
  iterator started (a ``RandomSampler`` and ``DataLoader`` draw their seeds from torch's
  generator then), set back before the iterator is made again; the sampler's epoch
  (``DistributedSampler`` shuffles by seed and epoch) is set before that too.
* **what follows**: the host's random states at the checkpoint, set back before the first batch the
  checkpointed run had not fetched (and, for a loader without length, which Lightning fetches one
  batch ahead, the states before each batch fetched ahead, so those are fetched again as they were);
  and the run's device seed, where the strategy has one (its ``run_seed``: a backend whose device
  generator is seeded per batch from it).

Outside a resume from inside an epoch, ``iter()`` goes straight to the loader, so the host random
numbers are drawn where plain Lightning draws them (over a ``CombinedLoader``, every loader's
``iter()`` comes before the first batch of any). In a resume from inside an epoch the inner
iterator is made at the first ``next()``. The epoch a state belongs to is matched at the first
``next()`` too: Lightning calls ``iter()`` before its loop moves a resumed fit to its epoch (a
checkpoint at an epoch's last batch is trained on in the next epoch). An epoch resumed at its end
yields nothing more: a fit resumed from inside an epoch's last validation that will not validate
(no ``val_dataloader`` in the rerun) otherwise trains one batch more than the epoch has (its
restarted epoch loop waits for that validation, Lightning's ``_is_validation_done``). Lightning gives
the loaders their states only when its loop restarts inside an epoch; resumed after an epoch's end,
the states are read from the checkpoint (:meth:`ResumesLoaderPosition.load_checkpoint`) and the host
states there set before the next epoch's iterator is made. In a ``CombinedLoader`` each loader's
position is its position in its own pass (``max_size_cycle`` starts a shorter loader over within
the epoch), with the host states before that pass's first batch (its sampler's seed: the other
loaders' ``iter()`` came in between). A loader thread that fetches ahead of the loop (a backend's
device loader) waits for the loop to start before its first batch.
A loader that has ``state_dict``/``load_state_dict`` itself keeps its own position (it is given
its state); the random states are still restored.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator
from typing import Any, Optional

from lightning.fabric.utilities.data import _set_sampler_epoch
from lightning.fabric.utilities.rank_zero import rank_zero_warn
from lightning.fabric.utilities.types import _Stateful
from torch.utils.data import DataLoader, IterableDataset

from trainer_plugins.long_runs._rng_states import host_states, restore_host_states

#: Version of the state a :class:`ResumableLoader` writes; a state of another version is refused with a warning.
STATE_VERSION = 1

#: Seconds a loader thread fetching ahead waits for the fit's loop to start (:meth:`ResumableLoader.wait_for_the_loop`).
LOOP_START_TIMEOUT_S = 600

#: The checkpoint's top-level key for the training loaders' positions (Lightning leaves keys it does not know).
CHECKPOINT_KEY = "loader_positions"
#: Other keys under which earlier checkpoints hold the positions, read where :data:`CHECKPOINT_KEY` is absent
#: (:func:`accept_earlier_key`; a backend plugin whose checkpoints had a key of its own adds it).
EARLIER_CHECKPOINT_KEYS: list[str] = []


def accept_earlier_key(key: str) -> None:
    """Read the loaders' positions of a checkpoint under ``key`` too, where :data:`CHECKPOINT_KEY` is absent.

    For a backend plugin whose checkpoints held the positions under a key of its own before the code
    moved here; calling it again changes nothing.

    Args:
        key: a top-level checkpoint key other than :data:`CHECKPOINT_KEY`, e.g. ``"my_backend_loader_positions"``.

    Raises:
        ValueError: ``key`` is empty, not a string, or :data:`CHECKPOINT_KEY` itself.
    """
    if not isinstance(key, str) or not key or key == CHECKPOINT_KEY:
        raise ValueError(f"accept_earlier_key({key!r}): give a checkpoint key other than {CHECKPOINT_KEY!r}.")
    if key not in EARLIER_CHECKPOINT_KEYS:
        EARLIER_CHECKPOINT_KEYS.append(key)


class InexactResumeWarning(UserWarning):
    """A resumed fit cannot continue exactly where the checkpointed run stopped (the message says why)."""


def _map_style(loader: Any) -> bool:
    """Whether ``loader`` is a ``DataLoader`` over a map-style dataset (its batches follow from its sampler)."""
    return isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset)


def _replays(loader: Any) -> bool:
    """Whether skipping ``loader``'s batches means fetching them (not a map-style ``DataLoader`` without workers)."""
    return not _map_style(loader) or loader.num_workers > 0


def _skip(iterator: Iterator, loader: Any, count: int) -> None:
    """Advance ``iterator`` (of ``loader``) past ``count`` batches; stop early if it ends."""
    sampler_iterator = None if _replays(loader) else getattr(iterator, "_sampler_iter", None)
    source = iterator if sampler_iterator is None else sampler_iterator
    for _ in range(count):
        try:
            next(source)
        except StopIteration:
            return


def _length(loader: Any) -> Optional[int]:
    try:
        return len(loader)
    except TypeError:
        return None


class _Epoch:
    """One epoch's iteration of a :class:`ResumableLoader` (one pass's, in a ``CombinedLoader``'s ``max_size_cycle``).

    Outside a resume from inside an epoch the inner iterator is made at once (``iter()`` passed
    straight through, so the host random numbers are drawn where plain Lightning draws them); in a
    resume from inside an epoch it is made at the first ``next()``. The fit's epoch is read at the
    first ``next()`` in both cases: Lightning makes the iterator of a resumed fit's first epoch
    before its loop decides which epoch that is.
    """

    def __init__(self, owner: ResumableLoader, eager: bool) -> None:
        self.owner = owner
        self.epoch = -1  # decided at the first next()
        self.started = False
        self.fetched = 0  # inner batches fetched in this epoch (pass)
        self.offset = 0  # the loader's batches fetched in the fit's epoch before this pass
        self.start_states: Optional[dict] = None  # host states at iter()
        self.first_fetch_states: Optional[dict] = None  # host states before the first fetch (a sampler's seed)
        # host states before each fetch, for a loader without length (Lightning fetches ahead of training)
        self.before_fetch: Optional[collections.deque] = None
        self._iterator: Optional[Iterator] = None
        self._restores: list[dict] = []  # host states to set before the next fetches, in order (a resume)
        if eager:
            self.start_states = host_states()
            self._iterator = iter(owner.loader)

    def __iter__(self) -> _Epoch:
        return self

    def __next__(self) -> Any:
        if not self.started:
            self._start()
        if self._restores:
            restore_host_states(self._restores.pop(0))
        if self.before_fetch is not None:
            self.before_fetch.append(host_states())
        if self.fetched == 0:
            self.first_fetch_states = host_states()
        batch = next(self._iterator)  # type: ignore[arg-type]
        self.fetched += 1
        counts = self.owner.__dict__  # its own attributes, set without its __setattr__: no Python call a batch
        counts["epoch_fetched"] += 1
        counts["fetched_any"] = True
        return batch

    def _start(self) -> None:
        owner, loader = self.owner, self.owner.loader
        self.started = True
        owner.wait_for_the_loop()
        self.epoch = owner.trainer.fit_loop.epoch_progress.current.processed
        if _length(loader) is None:
            self.before_fetch = collections.deque(maxlen=4 * owner.per_step + 4)
        state = owner.pending
        if state is not None and state["complete"] and state["epoch"] == self.epoch:
            # the epoch was trained to its end: nothing is left of it (Lightning asks for one more batch
            # when a fit resumed from inside the epoch's validation will not validate: none comes); the
            # state waits for the next epoch's iterator
            self._iterator = iter(())
            return
        owner.current = self
        owner.pending = None
        if owner.counted_epoch != self.epoch:
            owner.counted_epoch, owner.epoch_fetched = self.epoch, 0
        self.offset = owner.epoch_fetched
        expected = None if state is None else state["epoch"] + (1 if state["complete"] else 0)
        if state is not None and expected != self.epoch:
            owner.warn(f"it holds the position of epoch {expected}, the loop resumed in epoch {self.epoch}")
            state = None
        _set_sampler_epoch(loader, self.epoch)  # as Lightning did, unless a loader thread fetches ahead of it
        if self._iterator is not None:  # made at iter(): a fresh epoch (its random states set there, if resumed)
            return
        if state is None or state["complete"] or state["start_states"] is None or owner.inner_stateful:
            if state is not None:
                restore_host_states(state["states"])
            self.start_states = host_states()
            self._iterator = iter(loader)
            return
        restore_host_states(state["start_states"])
        self.start_states = state["start_states"]
        self._iterator = iter(loader)
        first_fetch = state.get("first_fetch_states")
        if first_fetch is not None and state["trained"]:
            restore_host_states(first_fetch)  # other loaders' iter() came between (a CombinedLoader)
            self.first_fetch_states = first_fetch
        _skip(self._iterator, loader, state["trained"])
        self.fetched = state["trained"]
        self.offset = state.get("offset", 0)
        owner.epoch_fetched = self.offset + self.fetched
        self._restores = [*state["before_fetch"], state["states"]]


class ResumableLoader:
    """A fit's training loader, resumable at the batch where a checkpoint was taken (Lightning's stateful loader).

    Attributes it does not define (``dataset``, ``sampler``, ``batch_size``, ...) are the loader's, read
    and set.

    Args:
        loader: the training loader (any iterable of batches; a ``DataLoader`` usually).
        trainer: the Trainer whose fit loop trains it (its progress gives the position).
        seeds: the strategy; its ``run_seed`` (where it has one: the seed its device generator is seeded
            from per batch) is kept with the position.
        per_step: loader batches per training step (an SPMD strategy joins one per device).
        checkpoint_states: the fit loop's ``combined_loader`` list of the checkpoint the fit resumes, if any.
    """

    loader: Any
    trainer: Any
    seeds: Any
    per_step: int
    #: The iteration of the epoch under way (the last one started), ``None`` before the first.
    current: Optional[_Epoch]
    #: A state loaded by :meth:`load_state_dict` that no iteration has started from yet.
    pending: Optional[dict[str, Any]]
    #: Whether a batch was fetched in this fit (a resume's random states are set before the first only).
    fetched_any: bool
    #: The loader's batches fetched in the fit's epoch ``counted_epoch`` (over its passes, in ``max_size_cycle``).
    epoch_fetched: int
    counted_epoch: int
    #: Set when the fit's loop has decided its epoch (the ``on_train_start`` strategy hook, after its ``reset``).
    loop_started: threading.Event
    #: The thread running the fit's loop (which calls ``process_dataloader``).
    loop_thread: threading.Thread
    #: The ``combined_loader`` states of the checkpoint the fit resumes, until the first ``iter()`` reads them.
    checkpoint_states: Optional[list]
    _warned: bool

    def __init__(
        self, loader: Any, trainer: Any, seeds: Any, per_step: int = 1, checkpoint_states: Optional[list] = None
    ) -> None:
        self.__dict__.update(
            loader=loader,
            trainer=trainer,
            seeds=seeds,
            per_step=per_step,
            current=None,
            pending=None,
            fetched_any=False,
            epoch_fetched=0,
            counted_epoch=-1,
            loop_started=threading.Event(),
            loop_thread=threading.current_thread(),
            checkpoint_states=checkpoint_states,
            _warned=False,
        )

    def __getattr__(self, name: str) -> Any:
        loader = self.__dict__.get("loader")
        if loader is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(loader, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.__dict__:
            self.__dict__[name] = value
        else:
            setattr(self.loader, name, value)  # e.g. Lightning's worker_init_fn goes to the real loader

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> _Epoch:
        """The iteration of an epoch (or pass); see :class:`_Epoch` for when the inner iterator is made.

        A state at an epoch's end (``complete``) that no batch was fetched after yet sets the host
        random states of the checkpoint before the inner iterator is made (by the fit's first
        stateful loader: the others follow it, as their ``iter()`` followed its in the run that wrote
        the checkpoint), at every such ``iter()``: Lightning makes a resumed fit's iterator once
        more when its epoch loop restarts after the epoch's validation.
        """
        self._consult_checkpoint()
        state = self.pending
        if state is not None and not state["complete"]:
            return _Epoch(self, eager=False)
        if state is not None and not any(sibling.fetched_any for sibling in self._siblings()):
            siblings = self._siblings()
            if not siblings or siblings[0] is self:
                restore_host_states(state["states"])
        return _Epoch(self, eager=True)

    def wait_for_the_loop(self) -> None:
        """In a thread fetching ahead of the fit's loop, wait until the loop has decided its epoch.

        a backend's device loader (a thread fetching ahead) fetches in a thread of its own from the
        moment Lightning calls ``iter()``, which Lightning's fit loop does before its ``reset`` moves a
        resumed fit to its epoch. The loop's own thread never waits (Lightning fetches ahead there
        for a loader without length, before ``on_train_start``). Waits at most
        :data:`LOOP_START_TIMEOUT_S`, then goes on with a warning.
        """
        if threading.current_thread() is self.loop_thread or self.loop_started.is_set():
            return
        if not self.loop_started.wait(LOOP_START_TIMEOUT_S):
            self.warn(f"its loader's thread found the fit's loop not started within {LOOP_START_TIMEOUT_S} s")

    def _siblings(self) -> list[ResumableLoader]:
        """The fit's stateful training loaders (``CombinedLoader.flattened``), as resumable loaders, in order."""
        combined = getattr(self.trainer.fit_loop, "_combined_loader", None)
        found = []
        for loader in getattr(combined, "flattened", None) or ():
            owner = getattr(getattr(loader, "state_dict", None), "__self__", None)
            if isinstance(owner, ResumableLoader):
                found.append(owner)
        return found

    def _consult_checkpoint(self) -> None:
        """Take this loader's state from the resumed checkpoint (:attr:`checkpoint_states`) if Lightning did not.

        Lightning's fit loop gives the stateful loaders their states only when it restarts inside an
        epoch (``_FitLoop._load_combined_loader_states``); resumed from a checkpoint written after an
        epoch's end it gives none, and the random states there are what the next epoch's shuffle is
        drawn from. Read once, at the fit's first ``iter()``.
        """
        states, self.checkpoint_states = self.checkpoint_states, None
        if self.pending is not None or not states:
            return
        combined = self.trainer.fit_loop._combined_loader
        stateful = [loader for loader in combined.flattened if isinstance(loader, _Stateful)]
        mine = [i for i, loader in enumerate(stateful) if getattr(loader, "state_dict", None) == self.state_dict]
        if mine and mine[0] < len(states) and isinstance(states[mine[0]], dict):
            self.load_state_dict(states[mine[0]])

    @property
    def inner_stateful(self) -> bool:
        """Whether the loader keeps its own position (has ``state_dict`` and ``load_state_dict``)."""
        return isinstance(self.loader, _Stateful)

    def state_dict(self) -> dict[str, Any]:
        """The position and random states to resume from (see the module docstring); plain values and tensors."""
        if self.pending is not None:  # restored, not iterated yet: the position has not moved
            state = dict(self.pending)
        else:
            loop = self.trainer.fit_loop
            progress = loop.epoch_loop.batch_progress
            epoch = self.current
            trained = progress.current.processed if epoch is not None else 0
            complete = epoch is not None and (progress.is_last_batch or trained >= self.trainer.num_training_batches)
            before = list(epoch.before_fetch or ()) if epoch is not None else []
            ahead = self.epoch_fetched - trained * self.per_step if epoch is not None else 0
            offset = epoch.offset if epoch is not None else 0
            state = {
                "version": STATE_VERSION,
                "epoch": epoch.epoch if epoch is not None else loop.epoch_progress.current.processed,
                "trained": trained * self.per_step - offset,
                "offset": offset,
                "complete": complete,
                "start_states": epoch.start_states if epoch is not None else None,
                "first_fetch_states": epoch.first_fetch_states if epoch is not None else None,
                "before_fetch": before[len(before) - ahead :] if 0 < ahead <= len(before) else [],
                "states": host_states(),
                "run_seed": getattr(self.seeds, "run_seed", None),
            }
        if self.inner_stateful:
            state["loader"] = self.loader.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state`` (from :meth:`state_dict`): the device seed now, the position at the next iteration.

        A state of another :data:`STATE_VERSION` is ignored with an :class:`InexactResumeWarning`; the
        loader's own state (a checkpoint written without this plugin) goes to the loader.
        """
        if "version" not in state and "run_seed" not in state and self.inner_stateful:
            self.loader.load_state_dict(state)  # the loader's own state, from a run without this plugin
            return
        if state.get("version") != STATE_VERSION:
            self.warn(f"its position was written in another format (version {state.get('version')!r})")
            return
        if state["run_seed"] is not None and hasattr(self.seeds, "run_seed"):
            self.seeds.run_seed = state["run_seed"]
        if self.inner_stateful and "loader" in state:
            self.loader.load_state_dict(state["loader"])
        elif not state["complete"] and state["trained"] and not _map_style(self.loader):
            what = "a DataLoader over an IterableDataset" if isinstance(self.loader, DataLoader) else "not a DataLoader"
            self.warn(
                f"its training loader is {what}: the {state['trained']} batches of epoch {state['epoch']} already"
                " trained are fetched again and dropped, and the run continues exactly only if the loader yields"
                " the same batches in the same order each time it is iterated; a loader with state_dict() and"
                " load_state_dict() keeps its own position"
            )
        self.pending = state

    def warn(self, reason: str) -> None:
        """Warn once per loader that the resume is not exact, for ``reason``."""
        if not self._warned:
            self._warned = True
            rank_zero_warn(
                f"The resumed fit may not continue exactly where its checkpoint was written: {reason}.",
                category=InexactResumeWarning,
            )


def _loader_states(checkpoint: dict[str, Any]) -> Optional[list]:
    """The fit loop's ``combined_loader`` list of ``checkpoint``, ``None`` if it has none."""
    fit_loop = checkpoint.get("loops", {}).get("fit_loop", {})
    states = fit_loop.get("state_dict", {}).get("combined_loader")
    return states if isinstance(states, list) else None


def portable(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """``checkpoint`` with the :class:`ResumableLoader` states moved from ``combined_loader`` to :data:`CHECKPOINT_KEY`.

    ``combined_loader`` keeps the inner loaders' own states (of those that have one), in order, as
    plain Lightning writes them; each position records whether its loader had one. A checkpoint
    without such states is returned as it is; otherwise a copy (``checkpoint`` is not changed).

    Args:
        checkpoint: a Trainer checkpoint (Lightning's ``dump_checkpoint``).
    """
    states = _loader_states(checkpoint)
    if not states or not all(isinstance(s, dict) and s.get("version") == STATE_VERSION for s in states):
        return checkpoint
    positions = [{**{k: v for k, v in s.items() if k != "loader"}, "has_loader_state": "loader" in s} for s in states]
    loops, fit_loop = checkpoint["loops"], checkpoint["loops"]["fit_loop"]
    inner = [s["loader"] for s in states if "loader" in s]
    fit_state = {**fit_loop["state_dict"], "combined_loader": inner}
    loops = {**loops, "fit_loop": {**fit_loop, "state_dict": fit_state}}
    return {**checkpoint, "loops": loops, CHECKPOINT_KEY: positions}


def resumable(checkpoint: Any) -> Any:
    """The inverse of :func:`portable`: the positions back in ``combined_loader``, each with its loader's state.

    ``checkpoint`` (a loaded dict) is changed in place and returned; positions under one of
    :data:`EARLIER_CHECKPOINT_KEYS` are read as well. One without them is returned as it is (a
    checkpoint of plain Lightning, or one whose positions never left).

    Raises:
        ValueError: the positions name more loader states than ``combined_loader`` holds.
    """
    key = (
        next((k for k in (CHECKPOINT_KEY, *EARLIER_CHECKPOINT_KEYS) if k in checkpoint), CHECKPOINT_KEY)
        if isinstance(checkpoint, dict)
        else CHECKPOINT_KEY
    )
    positions = checkpoint.get(key) if isinstance(checkpoint, dict) else None
    states = _loader_states(checkpoint) if positions is not None else None
    if positions is None or states is None:
        return checkpoint
    inner = iter(states)
    restored = []
    for position in positions:
        position = dict(position)
        if position.pop("has_loader_state"):
            state = next(inner, None)
            if state is None:
                raise ValueError(
                    f"The checkpoint's {key!r} name more loader states than its combined_loader holds ({len(states)})."
                )
            position["loader"] = state
        restored.append(position)
    checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"] = restored
    del checkpoint[key]
    return checkpoint


class ResumesLoaderPosition:
    """Mixin for a backend's Trainer strategies: the fit's training loader is a :class:`ResumableLoader`.

    The wrapper goes around the loader Lightning hands to ``process_dataloader`` (after Lightning's
    sampler injection), inside what the strategy makes of it (the SPMD strategies' global batches,
    whose ``process_dataloader`` calls this one first, the spawn strategy's ``MpDeviceLoader``, which
    is given the wrapper's ``state_dict`` and ``load_state_dict``), so skipped batches never reach the
    device. A strategy joining several loader batches into one step says how many with
    ``loader_batches_per_step()``. Other loaders (validation, test, prediction) are left as they are.
    """

    lightning_module: Any
    #: The loader states of the checkpoint a fit resumes (read by :meth:`load_checkpoint`), until training starts.
    _loader_states_to_load: Optional[list] = None

    #: The training loaders made resumable whose threads may still wait for the fit's loop to start.
    _waiting_loaders: Optional[list[ResumableLoader]] = None

    def _release_loaders(self) -> None:
        for loader in self._waiting_loaders or ():
            loader.loop_started.set()
        self._waiting_loaders = None

    def on_train_start(self) -> None:
        """Let the training loaders' threads fetch: the fit's loop has decided its epoch."""
        super().on_train_start()  # type: ignore[misc]
        self._loader_states_to_load = None
        self._release_loaders()

    def teardown(self) -> None:
        """Release the loaders' threads of a fit that ended before training started (``max_steps`` reached, say)."""
        self._release_loaders()
        super().teardown()  # type: ignore[misc]

    def save_checkpoint(self, checkpoint: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        """Write ``checkpoint`` with the training loaders' positions under :data:`CHECKPOINT_KEY` (:func:`portable`)."""
        super().save_checkpoint(portable(checkpoint), *args, **kwargs)  # type: ignore[misc]

    def load_checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """Read a checkpoint, the training loaders' positions back where the fit loop reads them (:func:`resumable`).

        In a fit they are also kept for the training loaders: Lightning gives them to the loaders
        only when its loop restarts inside an epoch (:meth:`ResumableLoader._consult_checkpoint`).
        """
        from lightning.pytorch.trainer.states import TrainerFn

        checkpoint = resumable(super().load_checkpoint(*args, **kwargs))  # type: ignore[misc]
        module = self.lightning_module
        fitting = module is not None and module._trainer is not None and module.trainer.state.fn == TrainerFn.FITTING
        self._loader_states_to_load = _loader_states(checkpoint) if fitting and isinstance(checkpoint, dict) else None
        return checkpoint

    def process_dataloader(self, dataloader: object) -> object:
        from lightning.pytorch.trainer.states import RunningStage, TrainerFn

        module = self.lightning_module
        trainer = module.trainer if module is not None and module._trainer is not None else None
        if trainer is None or trainer.state.fn != TrainerFn.FITTING or trainer.state.stage != RunningStage.TRAINING:
            return super().process_dataloader(dataloader)  # type: ignore[misc]
        per_step = self.loader_batches_per_step() if hasattr(self, "loader_batches_per_step") else 1
        resumable = ResumableLoader(dataloader, trainer, self, per_step, self._loader_states_to_load)
        self._waiting_loaders = [*(self._waiting_loaders or ()), resumable]
        processed = super().process_dataloader(resumable)  # type: ignore[misc]
        if not isinstance(processed, _Stateful):  # a backend's device loader: Lightning reads these two names
            processed.state_dict = resumable.state_dict  # type: ignore[attr-defined]
            processed.load_state_dict = resumable.load_state_dict  # type: ignore[attr-defined]
        return processed
