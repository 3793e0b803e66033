"""The GPT workload (examples/gpt_stdlib.py): its data is the standard library's bytes; it trains through Lightning."""

from __future__ import annotations

import ast
import importlib.util
import math
import re
import subprocess
import sys
import sysconfig
import zlib
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lightning")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "gpt_stdlib.py"
TINY = dict(block_size=16, n_layer=1, n_head=2, n_embd=16)
STEP_LINE = re.compile(r"step (\d+): train_loss=(\d+\.\d{4}) val_loss=(\d+\.\d{4}) bits_per_byte=(\d+\.\d{3})")
LAST_LINE = re.compile(r"val_loss=(\d+\.\d{4}) bits_per_byte=(\d+\.\d{3}) steps=(\d+) tied=(True|False)")


def load_example():
    spec = importlib.util.spec_from_file_location("gpt_stdlib", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpt_stdlib"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


gpt = load_example()
STDLIB = Path(sysconfig.get_paths()["stdlib"])


def test_the_sources_are_the_standard_librarys_py_files_sorted_without_third_party_packages():
    sources = gpt.stdlib_sources()
    relative = [path.relative_to(STDLIB).as_posix() for path in sources]
    assert relative == sorted(relative)
    assert {"os.py", "json/__init__.py", "collections/__init__.py"} <= set(relative)
    assert all(path.suffix == ".py" for path in sources)
    assert not any(part in ("site-packages", "dist-packages") for path in relative for part in path.split("/"))
    assert gpt.stdlib_sources() == sources  # deterministic


def test_the_split_is_by_file_and_the_bytes_are_the_files_joined(tmp_path):
    # a standard-library folder of our own: the split and the joining are checked on known bytes
    names = [f"lib{i % 4}/m{i:02}.py" for i in range(40)] + ["top.py", "site-packages/third.py", "notes.txt"]
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(f"# {name}\n".encode())
    train, val = gpt.stdlib_bytes(tmp_path)
    python = names[:41]  # the .py files outside site-packages
    held_out = [name for name in python if zlib.crc32(name.encode()) % gpt.VALIDATION_EVERY == 0]
    assert held_out  # the folder above has files on both sides
    assert bytes(val.tolist()) == b"".join(f"# {name}\n".encode() for name in sorted(held_out))
    assert bytes(train.tolist()) == b"".join(f"# {name}\n".encode() for name in sorted(set(python) - set(held_out)))
    assert train.dtype == val.dtype == torch.uint8


def test_the_real_splits_are_large_and_disjoint_by_file():
    train, val = gpt.stdlib_bytes()
    total = sum(path.stat().st_size for path in gpt.stdlib_sources())
    assert train.numel() + val.numel() == total
    assert train.numel() > 1_000_000 and 0.01 < val.numel() / total < 0.15


def test_a_window_is_the_next_bytes_and_its_target_is_shifted_by_one():
    data = torch.arange(100, dtype=torch.uint8)
    windows = gpt.ByteWindows(data, block_size=8)
    assert len(windows) == 12  # (100 - 1) // 8: the last window needs one byte past its input
    x, y = windows[3]
    assert x.dtype == y.dtype == torch.int64
    assert x.tolist() == list(range(24, 32)) and y.tolist() == list(range(25, 33))
    assert windows[11][1].tolist() == list(range(89, 97))
    with pytest.raises(IndexError, match="window 12 out of range"):
        windows[12]
    with pytest.raises(ValueError, match="8 bytes are fewer than one window of 9"):
        gpt.ByteWindows(data[:8], block_size=8)


def test_the_loaders_give_full_batches_of_stdlib_windows():
    data = gpt.StdlibBytes(block_size=32, batch_size=4)
    data.setup("fit")
    x, y = next(iter(data.val_dataloader()))
    assert x.shape == y.shape == (4, 32)
    first = next(path for path in gpt.stdlib_sources() if gpt.is_validation(path.relative_to(STDLIB).as_posix()))
    assert bytes(x[0].tolist()) == first.read_bytes()[:32]  # validation is not shuffled
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert all(loader.drop_last for loader in (data.train_dataloader(), data.val_dataloader()))


def test_generation_continues_the_prompt_and_is_seeded():
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(**TINY))
    sample = gpt.generate(model, b"def ", 24, seed=3)
    assert len(sample) == 28 and sample.startswith(b"def ")
    assert gpt.generate(model, b"def ", 24, seed=3) == sample  # longer than block_size: the context is cut
    assert model.training


def test_the_example_imports_neither_trainer_plugins_nor_xla_plugins():
    imported = set()
    for node in ast.walk(ast.parse(EXAMPLE.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert "lightning" in imported
    assert not imported & {"trainer_plugins", "xla_plugins"}


@pytest.mark.xla
def test_moving_to_xla_unties_and_tie_weights_ties_again():
    import torch_xla

    model = gpt.GPT(gpt.GPTConfig(**TINY))
    assert model.tied
    model.to(torch_xla.device())
    assert not model.tied  # torch's Module.to gives each module a parameter of its own
    model.tie_weights()
    assert model.tied and len(list(model.parameters())) == len(set(model.state_dict())) - 1


@pytest.fixture(scope="module")
def example_run():
    """The example as a user runs it, on one PJRT CPU device, with a tiny model: 30 steps, validation every 10."""
    sizes = ["--block-size", "32", "--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--batch-size", "8"]
    schedule = ["--steps", "30", "--val-every", "10", "--val-batches", "4", "--sample-bytes", "20"]
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), *sizes, *schedule], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.mark.slow  # CI budget: primary tox cell only (tox.ini)
@pytest.mark.xla
def test_the_example_trains_on_single_xla_through_the_plain_trainer(example_run):
    output = example_run.stdout + example_run.stderr
    assert "strategy=single_xla" in output  # the plugin, found through its entry point
    printed = [(int(step), float(val)) for step, _, val, _ in STEP_LINE.findall(example_run.stdout)]
    assert [step for step, _ in printed] == [10, 20, 30]
    losses = [val for _, val in printed]
    assert losses[0] < math.log(256)  # below guessing a byte uniformly
    assert losses[0] > losses[1] > losses[2]  # and going down
    last = LAST_LINE.fullmatch(example_run.stdout.rstrip("\n").splitlines()[-1])
    assert last and float(last.group(1)) == losses[2] and last.group(3) == "30"
    sample = example_run.stdout.split("--- sample ---\n")[1].split("\n---\n")[0]
    assert sample.startswith("def ")


@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
@pytest.mark.xla
def test_the_output_layer_is_still_tied_after_fit(example_run):
    assert example_run.stdout.rstrip("\n").splitlines()[-1].endswith("tied=True")


@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
@pytest.mark.xla
def test_the_example_gives_no_compile_monitor_report_and_ends_with_its_summary(example_run):
    output = example_run.stdout + example_run.stderr
    assert "XLA compile monitor:" not in output  # no late compilation, no host read inside a step
    assert "xla-plugins: fit ended at trainer.global_step=" in output  # the monitor ran: its line when fit ended
    assert "XLA compile monitor (fit):" not in output  # no table: nothing needs attention
