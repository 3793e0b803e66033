"""Exact continuation: a fit stopped by SIGTERM and resumed with ``ckpt_path="last"`` ends as the uninterrupted fit.

Every run is tests/scripts/exact_resume.py in its own process under a timeout, on real torch_xla
(PJRT CPU): a seeded fit with dropout, a step LR scheduler, ``accumulate_grad_batches=2``, a
shuffled training loader and a validation loader, 3 epochs of 8 batches. The fault-injection
matrix stops each strategy's fit 3 times at points drawn with a seeded generator (inside an
accumulation window or at its end, during validation, in the first batch of a resumed run, before
its first step's graph is compiled) and resumes it each time; the final weights must equal the
uninterrupted fit's bit for bit (``torch.equal``, fp32), the batches trained, recorded with
their sample indices, must be the same, in the same order, and every epoch's validation must have
ended with the same loss. The matrix runs on both backends from the same code: the XLA strategies
(marked ``xla``) and the TorchTPU plugin's single-device and two-process DDP strategies on the
stand-in device (marked ``torchtpu``, the torchtpu-torch* tox cells). The loader's own rules (skipping
without loading, replaying, the warning) are checked on CPU below, without a fit.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

SCRIPT = Path(__file__).parent / "scripts" / "exact_resume.py"
DEVICES = {"single_xla": 1, "xla_spmd": 4, "xla_fsdp_v2": 4, "xla": 4, "torchtpu": 1, "torchtpu_ddp": 2}
#: The strategies whose processes or replicas agree on the stop at a batch start (up to a batch later, then the
#: end of the accumulation window), rather than stopping after the batch in flight.
AGREEING = ("xla", "torchtpu_ddp")
#: The strategies of the matrix, marked with their backend (a cell without that backend skips them, saying why):
#: TorchTPU's DDP runs the one-stop test below instead (its two-process fits cost the torchtpu cells most).
BACKEND_STRATEGIES = [
    *(pytest.param(name, marks=pytest.mark.xla) for name in ("single_xla", "xla_spmd", "xla_fsdp_v2", "xla")),
    pytest.param("torchtpu", marks=pytest.mark.torchtpu),
]
#: One device on each backend, and TorchTPU's two-process DDP.
ONE_STOP_STRATEGIES = [
    pytest.param("single_xla", marks=pytest.mark.xla),
    *(pytest.param(name, marks=pytest.mark.torchtpu) for name in ("torchtpu", "torchtpu_ddp")),
]
TRAIN_BATCHES, VAL_BATCHES, EPOCHS, ACCUMULATE = 8, 4, 3, 2  # as in the script
TOTAL = TRAIN_BATCHES * EPOCHS
TIMEOUT_S = 420
_uninterrupted: dict[str, Path] = {}


def backend_environment(strategy: str) -> dict[str, str]:
    """What a run of ``strategy`` needs in its environment: PJRT CPU with its devices, or the TorchTPU stand-in."""
    if strategy.startswith("torchtpu"):
        from test_torchtpu_distributed import _free_port

        return {
            "TORCHTPU_PLUGINS_DEVICE": "cpu",
            "TORCHTPU_PLUGINS_DEVICE_COUNT": str(DEVICES[strategy]),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": _free_port(),
            "GLOO_SOCKET_IFNAME": "lo",
        }
    from xla_cpu_harness import required_environment

    return {**required_environment(DEVICES[strategy]), "XLA_PLUGINS_RECOMPILES": "off"}  # the script reads batches


def run(root: Path, strategy: str, *flags: str) -> subprocess.CompletedProcess:
    """One run of the script for ``strategy`` (its devices, :data:`DEVICES`; ``xla`` through the harness)."""
    root.mkdir(parents=True, exist_ok=True)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_PLUGINS_", "TRAINER_PLUGINS_"))}
    environ.update(backend_environment(strategy))
    if strategy == "xla":
        environ.update(HARNESS=str(Path(__file__).parent), XLA_PLUGINS_REPLICA_TIMEOUT="120")
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(root), "--strategy", strategy, *flags],
        env=environ,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def output(result: subprocess.CompletedProcess) -> str:
    return result.stdout[-3000:] + result.stderr[-6000:]


def uninterrupted(strategy: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The root of the strategy's uninterrupted fit (one per test session)."""
    if strategy not in _uninterrupted:
        root = tmp_path_factory.mktemp(f"uninterrupted-{strategy}")
        result = run(root, strategy)
        assert result.returncode == 0, output(result)
        assert f"FINAL_GLOBAL_STEP {TOTAL // ACCUMULATE}" in result.stdout, output(result)
        _uninterrupted[strategy] = root
    return _uninterrupted[strategy]


def seen(root: Path) -> list[dict]:
    """The batches the runs under ``root`` trained, in order (per rank for the spawn strategy's replicas)."""
    records = [json.loads(line) for line in (root / "seen.jsonl").read_text().splitlines()]
    return sorted(records, key=lambda record: record["rank"])  # stable: each rank's order is kept


def stop_checkpoint(root: Path) -> dict:
    path = root / "checkpoints" / "last-stopped.ckpt"
    if path.is_dir():  # a sharded checkpoint: all but the tensors
        return torch.load(path / "meta.pt", map_location="cpu", weights_only=False)
    return torch.load(path, map_location="cpu", weights_only=False)


def trained_batches(checkpoint: dict) -> int:
    """The fit's batches trained when the checkpoint was written (Lightning's epoch loop progress)."""
    return checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]["completed"]


def window_end(batch: int) -> int:
    """The batches trained once the accumulation window holding batch number ``batch`` (from 0) has stepped."""
    return (batch // ACCUMULATE + 1) * ACCUMULATE


def stop(root: Path, strategy: str, where: str, position: int, resume: bool, signal_to: str) -> int:
    """Run until the stop ``where`` ends it; check it stopped at the end of an accumulation window; the new position."""
    flags = ["--stop", where, "--signal-to", signal_to, *(["--resume"] if resume else [])]
    result = run(root, strategy, *flags)
    assert result.returncode == 143, output(result)
    checkpoint = stop_checkpoint(root)
    after = trained_batches(checkpoint)
    kind = where.split(":")[0]
    if kind == "val" and int(where.split(":")[2]) == VAL_BATCHES - 1:
        # in the validation's last batch Lightning's evaluation loop does not stop (it stops between batches only):
        # the validation ends, then its training loop stops, before the next epoch; nothing to run again on resume
        expected = (int(where.split(":")[1]) + 1) * TRAIN_BATCHES
        progress = checkpoint["loops"]["fit_loop"]["epoch_loop.val_loop.batch_progress"]
        assert strategy in AGREEING or progress["current"]["completed"] == VAL_BATCHES, progress
    elif kind == "val":  # the epoch's training is done; its validation starts again on resume
        epoch = int(where.split(":")[1])
        expected = (epoch + 1) * TRAIN_BATCHES
        progress = checkpoint["loops"]["fit_loop"]["epoch_loop.val_loop.batch_progress"]
        assert strategy in AGREEING or progress["current"]["completed"] == 0, progress
    else:
        expected = window_end(int(where.split(":")[1]) if kind == "batch" else position)
    if strategy in AGREEING:  # agreed on a batch up to 2 batches on, then on the window's end
        assert after >= expected and after % ACCUMULATE == 0, (where, after)
    else:
        assert after == expected, (where, after)
    return after


def stops(strategy: str) -> tuple[random.Random, list[str]]:
    """The generator of ``strategy``'s stop points, and the order of the three kinds of stop it draws."""
    generator = random.Random(f"exact resume {strategy}")
    kinds = ["batch", "first", "val"]
    generator.shuffle(kinds)
    return generator, kinds


def draw(kind: str, generator: random.Random, position: int) -> str:
    """A stop of ``kind`` at or after the fit's batch number ``position``, leaving batches to train after it."""
    if kind == "first":
        return "first"
    if kind == "val":
        return f"val:{position // TRAIN_BATCHES}:{generator.randrange(VAL_BATCHES)}"
    # within the next 4 batches: whatever the order, a later stop still has its batches, and validation its epoch
    return f"batch:{generator.randrange(position, position + TRAIN_BATCHES // 2)}"


def validated(root: Path) -> dict[int, float]:
    """Each epoch's validation loss, from the last validation of that epoch that ended (a stopped one did not)."""
    lines = (root / "validated.jsonl").read_text().splitlines()
    return {record["epoch"]: record["val_loss"] for record in map(json.loads, lines)}


def assert_same_fit(root: Path, reference: Path, stops: object = None) -> None:
    """Bitwise-equal final weights, the same batches (sample indices) in the same order, the same validations."""
    assert seen(root) == seen(reference), stops
    assert validated(root) == validated(reference), stops
    weights, expected = (torch.load(path / "weights.pt", weights_only=True) for path in (root, reference))
    assert weights.keys() == expected.keys()
    different = [name for name in expected if not torch.equal(weights[name], expected[name])]
    assert different == [], (different, stops)


def resume_to_the_end(root: Path, strategy: str) -> None:
    result = run(root, strategy, "--resume")
    assert result.returncode == 0, output(result)
    assert f"FINAL_GLOBAL_STEP {TOTAL // ACCUMULATE}" in result.stdout, output(result)


@pytest.mark.slow  # 5 fits per strategy, 4 devices for most: primary tox cell and the torchtpu cells (tox.ini)
@pytest.mark.parametrize("strategy", BACKEND_STRATEGIES)
def test_three_stops_at_seeded_random_points_then_the_uninterrupted_weights_and_samples(strategy, tmp_path_factory):
    reference = uninterrupted(strategy, tmp_path_factory)
    root = tmp_path_factory.mktemp(f"stopped-{strategy}")
    generator, kinds = stops(strategy)
    position, wheres = 0, []
    for number, kind in enumerate(kinds):
        where = draw(kind, generator, position)
        wheres.append(where)
        signal_to = "main" if strategy == "xla" and number == 1 else "this process"
        position = stop(root, strategy, where, position, resume=number > 0, signal_to=signal_to)
    resume_to_the_end(root, strategy)
    assert_same_fit(root, reference, wheres)


@pytest.mark.xla
@pytest.mark.slow  # 2 fits beside the shared uninterrupted one: primary tox cell only (tox.ini)
@pytest.mark.parametrize(
    ("where", "trained"),
    [("val:0:1", TRAIN_BATCHES), ("first", ACCUMULATE), ("sanity", 0)],
    ids=["during-validation", "during-the-first-compilation", "during-the-sanity-check"],
)
def test_one_sigterm_then_an_exact_resume(where, trained, tmp_path_factory):
    """SIGTERM during validation (epoch 0's, at its 2nd batch), in the first training step (before its graph is
    compiled; the stop waits for the accumulation window) and in the sanity check (the first validation graph)."""
    reference = uninterrupted("single_xla", tmp_path_factory)
    root = tmp_path_factory.mktemp(f"stopped-{where.replace(':', '-')}")
    result = run(root, "single_xla", "--stop", where)
    assert result.returncode == 143, output(result)
    checkpoint = stop_checkpoint(root)
    if trained:
        assert trained_batches(checkpoint) == trained
    else:  # nothing trained: the checkpoint keeps no loop progress, the rerun starts with its sanity check
        assert "loops" not in checkpoint and checkpoint["global_step"] == 0
    resume_to_the_end(root, "single_xla")
    assert_same_fit(root, reference)


@pytest.mark.slow  # CI budget: primary tox cell and the torchtpu cells (tox.ini)
@pytest.mark.parametrize("strategy", ONE_STOP_STRATEGIES)
def test_a_stop_inside_an_accumulation_window_waits_for_its_end_and_resumes_exactly(strategy, tmp_path_factory):
    """One stop signalled at batch 4 (the first of the window 4-5): the checkpoint holds 6 batches (with DDP the
    processes agree at batch 5's start, the window's end), and the resumed fit ends as the uninterrupted one."""
    reference = uninterrupted(strategy, tmp_path_factory)
    root = tmp_path_factory.mktemp(f"stopped-in-a-window-{strategy}")
    assert stop(root, strategy, "batch:4", 0, resume=False, signal_to="this process") == 6
    resume_to_the_end(root, strategy)
    assert_same_fit(root, reference)


# Resumes from each position class (tests/scripts/resume_positions.py: many fits in one process). A checkpoint of
# epoch 0 (mid1: of epoch 1) written by trainer.save_checkpoint (ckpt:P) or the stop checkpoint of a SIGTERM (stop:P).

POSITIONS_SCRIPT = Path(__file__).parent / "scripts" / "resume_positions.py"
#: Training batches the resumed fit trains, by position (3 epochs of 8): after batch 2, after epoch 0, after batch 4
#: of epoch 1; a stopped fit and its resume train all 24.
RESUMED_BATCHES = {"mid": TOTAL - 3, "last": TOTAL - 8, "val": TOTAL - 8, "next": TOTAL - 8, "mid1": TOTAL - 13}


def resume_positions(root: Path, strategy: str, cases: list[str], *flags: str) -> dict[tuple[str, str], dict]:
    """Run the positions script; its records by ``("CASE" or "PLAIN", case)``."""
    from xla_cpu_harness import required_environment

    environ = {k: v for k, v in os.environ.items() if not k.startswith("XLA_PLUGINS_")}
    environ.update(required_environment(DEVICES[strategy]), XLA_PLUGINS_RECOMPILES="off")
    if strategy == "xla":
        environ.update(HARNESS=str(Path(__file__).parent), XLA_PLUGINS_REPLICA_TIMEOUT="120")
    command = [sys.executable, str(POSITIONS_SCRIPT), str(root), "--strategy", strategy, "--cases", ",".join(cases)]
    result = subprocess.run(command + list(flags), env=environ, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == 0, output(result)
    records = {}
    for line in result.stdout.splitlines():
        tag, _, rest = line.partition(" ")
        if tag in ("CASE", "PLAIN"):
            name, _, record = rest.partition(" ")
            records[tag, name] = json.loads(record)
    return records


def assert_resumes_exactly(records: dict, cases: list[str], plain: bool) -> None:
    """Every case: the uninterrupted fit's last batches, in order, its weights bit for bit, its final step; with
    ``plain``, the same steps and validations as plain Lightning resumed from the same position."""
    reference = records["CASE", "uninterrupted"]
    assert reference["steps"] == TOTAL and len(reference["batches"]) == TOTAL
    for case in cases:
        kind, position = case.split(":")
        resumed = records["CASE", case]
        expected = reference["batches"] if kind == "stop" else reference["batches"][-RESUMED_BATCHES[position] :]
        assert resumed["batches"] == expected, case
        assert resumed["same_weights"], case
        assert resumed["steps"] == TOTAL, case
        if plain and kind == "ckpt":
            assert records["PLAIN", case]["steps"] == resumed["steps"], case
            assert records["PLAIN", case]["validations"] == resumed["validations"], case


ALL_POSITIONS = ["ckpt:mid", "ckpt:last", "ckpt:val", "ckpt:next", "ckpt:mid1", "stop:last", "stop:val", "stop:next"]


@pytest.mark.xla
@pytest.mark.subprocess  # 14 fits in one process: the cells that run subprocess tests (tox.ini)
def test_two_shuffled_loaders_train_plain_lightnings_order_and_resume_from_every_position_exactly_on_single_xla(
    tmp_path,
):
    """Issue 35: a checkpoint at an epoch's last batch skipped the next epoch (16 steps of 24); one after the epoch's
    end (on_train_epoch_end, or a SIGTERM on the last batch or in on_validation_end) shuffled the next epoch anew; two
    shuffled loaders trained another order than plain Lightning. A CombinedLoader (max_size_cycle) of 8 and 3 batches:
    the shorter one starts over twice an epoch; mid is at the end of its first pass, mid1 inside its second. No
    dropout (on CPU it draws from the loaders' generator)."""
    records = resume_positions(tmp_path, "single_xla", ALL_POSITIONS, "--loaders", "two", "--plain")
    assert records["CASE", "uninterrupted"]["batches"] == records["PLAIN", "uninterrupted"]["batches"]
    assert_resumes_exactly(records, ALL_POSITIONS, plain=True)
    assert records["PLAIN", "ckpt:last"]["validations"] == [1, 2]  # plain Lightning does not validate epoch 0 again


@pytest.mark.xla
@pytest.mark.slow  # 7 fits in one process: primary tox cell only (tox.ini)
def test_single_xla_with_dropout_resumes_from_an_epochs_end_exactly(tmp_path):
    """One shuffled loader, dropout on the device (seeded per batch): the weights of the uninterrupted fit."""
    cases = ["ckpt:last", "ckpt:val", "stop:last", "stop:next"]
    assert_resumes_exactly(resume_positions(tmp_path, "single_xla", cases), cases, plain=False)


def flattened(batches: list, loader: int) -> list[int]:
    return [index for batch in batches for index in batch[loader]]


@pytest.mark.xla
@pytest.mark.slow  # 4 devices, 5 fits (and plain Lightning's on CPU): primary tox cell only (tox.ini)
@pytest.mark.parametrize(
    ("strategy", "cases"),
    [
        ("xla_spmd", ["ckpt:last", "stop:next", "ckpt:mid1"]),
        ("xla_fsdp_v2", ["ckpt:mid", "ckpt:val", "stop:last"]),
    ],
)
def test_spmd_strategies_resume_two_loaders_from_every_position_exactly(strategy, cases, tmp_path):
    """Global batches join 4 loader batches: the sample order of each loader is plain Lightning's (one device)."""
    records = resume_positions(tmp_path, strategy, cases, "--loaders", "two", "--plain")
    for loader in (0, 1):
        ours, plain = (records[tag, "uninterrupted"]["batches"] for tag in ("CASE", "PLAIN"))
        assert flattened(ours, loader) == flattened(plain, loader)
    assert_resumes_exactly(records, cases, plain=False)


@pytest.mark.xla
@pytest.mark.slow  # 4 replica threads, 2 fits: primary tox cell only (tox.ini)
def test_the_spawn_strategy_resumes_two_loaders_from_an_epochs_last_batch_exactly(tmp_path):
    """The replicas' MpDeviceLoader fetches in a thread of its own from iter() on, before the resumed loop's epoch."""
    cases = ["ckpt:last"]
    records = resume_positions(tmp_path, "xla", cases, "--loaders", "two")
    assert_resumes_exactly(records, cases, plain=False)


# The loader's rules, on CPU: a fake Trainer holding the fit loop's progress.


class Counted(torch.utils.data.Dataset):
    def __init__(self, size: int) -> None:
        self.size, self.fetched = size, []

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> int:
        self.fetched.append(i)
        return i


def fake_trainer(epoch: int = 0, trained: int = 0, batches: int = 4) -> Any:
    progress = SimpleNamespace(current=SimpleNamespace(processed=trained), is_last_batch=False)
    fit_loop = SimpleNamespace(
        epoch_progress=SimpleNamespace(current=SimpleNamespace(processed=epoch)),
        epoch_loop=SimpleNamespace(batch_progress=progress),
    )
    return SimpleNamespace(fit_loop=fit_loop, num_training_batches=batches)


def state_after(loader: Any, trained: int) -> dict:
    """The state of ``loader``'s resumable wrapper once a fit trained ``trained`` of its batches."""
    from trainer_plugins.long_runs._loader_position import ResumableLoader

    trainer = fake_trainer()
    resumable = ResumableLoader(loader, trainer, SimpleNamespace(run_seed=7))
    iterator = iter(resumable)
    for _ in range(trained):
        next(iterator)
    trainer.fit_loop.epoch_loop.batch_progress.current.processed = trained
    return resumable.state_dict()


def resumed(loader: Any, state: dict) -> tuple[list, Any]:
    """The batches a fresh wrapper of ``loader`` yields after loading ``state``, and the wrapper's seeds."""
    from trainer_plugins.long_runs._loader_position import ResumableLoader

    seeds = SimpleNamespace(run_seed=0)
    resumable = ResumableLoader(loader, fake_trainer(trained=state["trained"]), seeds)
    resumable.load_state_dict(state)
    return [batch.tolist() for batch in resumable], seeds


@pytest.mark.xla
def test_a_map_style_loader_without_workers_skips_the_trained_batches_without_loading_them():
    torch.manual_seed(3)
    dataset = Counted(16)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, shuffle=True)
    torch.manual_seed(11)
    expected = [batch.tolist() for batch in loader]
    torch.manual_seed(11)
    state = state_after(loader, trained=2)
    dataset.fetched.clear()
    torch.manual_seed(999)  # another process: another generator state, restored from the checkpoint
    batches, seeds = resumed(loader, state)
    assert batches == expected[2:]
    assert sorted(dataset.fetched) == sorted(i for batch in expected[2:] for i in batch)  # nothing else loaded
    assert seeds.run_seed == 7


@pytest.mark.xla
def test_a_state_loads_with_weights_only_and_a_plain_iterable_resumes_by_replaying_with_one_warning(tmp_path):
    from trainer_plugins.long_runs._loader_position import InexactResumeWarning

    batches = [torch.tensor([i]) for i in range(5)]
    state = state_after(batches, trained=3)
    torch.save(state, tmp_path / "state.pt")
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        replayed, _ = resumed(batches, state)
    assert replayed == [[3], [4]]
    messages = [str(w.message) for w in caught if issubclass(w.category, InexactResumeWarning)]
    assert len(messages) == 1 and "not a DataLoader" in messages[0] and "3 batches of epoch 0" in messages[0]


@pytest.mark.xla
def test_a_loader_with_workers_resumes_with_the_batches_it_had_not_yielded():
    dataset = Counted(12)
    loader = torch.utils.data.DataLoader(dataset, batch_size=3, num_workers=1)
    expected = [batch.tolist() for batch in loader]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # exact: no warning
        batches, _ = resumed(loader, state_after(loader, trained=2))
    assert batches == expected[2:]


class OwnPosition:
    """A training loader that keeps its own position (Lightning's stateful loader protocol)."""

    def __init__(self, items: list) -> None:
        self.items, self.start = items, 0

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Any:
        return iter(self.items[self.start :])

    def state_dict(self) -> dict:
        return {"start": 2}

    def load_state_dict(self, state: dict) -> None:
        self.start = state["start"]


def checkpoint_with(*states: dict) -> dict:
    return {"epoch": 0, "loops": {"fit_loop": {"state_dict": {"combined_loader": list(states)}, "other": 1}}}


@pytest.mark.xla
def test_a_checkpoint_holds_in_combined_loader_only_what_plain_lightning_writes_and_reads_back_the_positions():
    """Lightning refuses more loader states than its loaders have (a resume on another accelerator)."""
    from trainer_plugins.long_runs._loader_position import CHECKPOINT_KEY, portable, resumable

    plain = state_after([torch.tensor([i]) for i in range(4)], trained=1)
    own = state_after(OwnPosition([torch.tensor([i]) for i in range(4)]), trained=1)
    assert own["loader"] == {"start": 2} and "loader" not in plain
    written = checkpoint_with(plain, own)
    saved = portable(written)
    assert saved["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [{"start": 2}]  # the inner loader's own
    assert saved["loops"]["fit_loop"]["other"] == 1 and len(saved[CHECKPOINT_KEY]) == 2
    assert len(written["loops"]["fit_loop"]["state_dict"]["combined_loader"]) == 2  # the original is unchanged
    read = resumable(saved)
    assert CHECKPOINT_KEY not in read
    assert read["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [plain, own]
    assert portable(checkpoint_with()) == checkpoint_with()  # nothing to move: as it was


@pytest.mark.xla
def test_a_loader_state_written_without_the_plugin_goes_to_the_loader():
    loader = OwnPosition([torch.tensor([i]) for i in range(4)])
    batches, _ = resumed(loader, {"start": 2, "trained": 0})
    assert batches == [[2], [3]]


@pytest.mark.xla
def test_positions_naming_more_loader_states_than_the_checkpoint_holds_are_refused():
    from trainer_plugins.long_runs._loader_position import CHECKPOINT_KEY, resumable

    checkpoint = checkpoint_with()
    checkpoint[CHECKPOINT_KEY] = [{"version": 1, "has_loader_state": True}]
    with pytest.raises(ValueError, match="more loader states than its combined_loader holds"):
        resumable(checkpoint)


@pytest.mark.xla
def test_positions_under_an_earlier_key_are_read_only_once_a_plugin_accepts_the_key(monkeypatch):
    """The core names no backend's key; a plugin adds the key its earlier checkpoints used (accept_earlier_key)."""
    from trainer_plugins.long_runs import _loader_position
    from trainer_plugins.long_runs._loader_position import CHECKPOINT_KEY, accept_earlier_key, portable, resumable

    monkeypatch.setattr(_loader_position, "EARLIER_CHECKPOINT_KEYS", [])
    plain = state_after([torch.tensor([i]) for i in range(4)], trained=1)
    own = state_after(OwnPosition([torch.tensor([i]) for i in range(4)]), trained=1)

    def written_under(key: str) -> dict:
        saved = portable(checkpoint_with(plain, own))
        saved[key] = saved.pop(CHECKPOINT_KEY)
        return saved

    assert resumable(written_under("my_backend_positions"))["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [
        {"start": 2}
    ]  # not accepted: left as it was (as plain Lightning reads it)
    accept_earlier_key("my_backend_positions")
    accept_earlier_key("my_backend_positions")  # again: nothing changes
    assert _loader_position.EARLIER_CHECKPOINT_KEYS == ["my_backend_positions"]
    read = resumable(written_under("my_backend_positions"))
    assert read["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [plain, own]
    for bad in ("", CHECKPOINT_KEY, None):
        with pytest.raises(ValueError, match=f"accept_earlier_key\\({bad!r}\\)"):
            accept_earlier_key(bad)


@pytest.mark.xla
def test_the_xla_strategies_read_the_positions_of_checkpoints_written_before_they_moved_to_the_core():
    """xla-plugins wrote them under "xla_plugins_loader_positions"; its Trainer strategies accept that key."""
    from trainer_plugins.long_runs import _loader_position
    from trainer_plugins.long_runs._loader_position import CHECKPOINT_KEY, portable, resumable
    from xla_plugins.strategies import single_xla  # noqa: F401  (what a Trainer on XLA imports)

    assert "xla_plugins_loader_positions" in _loader_position.EARLIER_CHECKPOINT_KEYS
    plain = state_after([torch.tensor([i]) for i in range(4)], trained=1)
    saved = portable(checkpoint_with(plain))
    saved["xla_plugins_loader_positions"] = saved.pop(CHECKPOINT_KEY)
    assert resumable(saved)["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [plain]


def two_shuffled_loaders_drawn(wrap: Any) -> list:
    """Three batches of each of two shuffled loaders wrapped by ``wrap``, fetched as Lightning's CombinedLoader does."""
    torch.manual_seed(5)
    loaders = [torch.utils.data.DataLoader(range(start, start + 12), batch_size=3, shuffle=True) for start in (0, 100)]
    iterators = [iter(wrap(loader)) for loader in loaders]  # every iter() first, then the batches
    return [[next(iterator).tolist() for iterator in iterators] for _ in range(3)]


@pytest.mark.xla
def test_the_resumable_loader_and_global_batches_call_iter_when_lightning_does():
    """Issue 35: deferred to the first batch, the second loader's shuffle was drawn after the first's, not plain's."""
    from trainer_plugins.long_runs._loader_position import ResumableLoader
    from xla_plugins.strategies._batches import GlobalBatches

    plain = two_shuffled_loaders_drawn(lambda loader: loader)
    assert two_shuffled_loaders_drawn(lambda loader: ResumableLoader(loader, fake_trainer(), None)) == plain
    assert two_shuffled_loaders_drawn(lambda loader: GlobalBatches(loader, 1)) == plain


@pytest.mark.xla
def test_a_state_at_an_epochs_last_batch_resumes_with_the_next_epoch_decided_at_its_first_batch():
    """Issue 35: Lightning calls iter() before its loop moves to the next epoch; the wrapper took the epoch from there
    and yielded nothing for it (a fit resumed from an epoch's last batch skipped the next epoch)."""
    from trainer_plugins.long_runs._loader_position import ResumableLoader

    loader = torch.utils.data.DataLoader(Counted(16), batch_size=4, shuffle=True)
    torch.manual_seed(11)
    state = state_after(loader, trained=4)
    state["complete"] = True  # the epoch's last batch (Lightning's is_last_batch)
    trainer = fake_trainer(epoch=0)
    resumable = ResumableLoader(loader, trainer, SimpleNamespace(run_seed=0))
    resumable.load_state_dict(state)
    torch.manual_seed(999)
    iterator = iter(resumable)  # FitLoop.setup_data, still in epoch 0
    trainer.fit_loop.epoch_progress.current.processed = 1  # FitLoop.reset: the epoch is over
    batches = [batch.tolist() for batch in iterator]
    torch.manual_seed(11)
    state_after(loader, trained=4)  # the run that wrote the state: its host generator at the checkpoint
    assert batches == [batch.tolist() for batch in loader]  # epoch 1, drawn from the checkpoint's states
