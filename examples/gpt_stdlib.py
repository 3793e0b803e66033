"""A small GPT-style language model trained on the Python standard library's own source code, read as bytes.

The real workload of this project's benchmarks (benchmarks/gpt.py, benchmarks/compile_time.py) and
an example of a plain ``lightning.Trainer`` on XLA: nothing here imports trainer-plugins or
xla-plugins; once ``xla-plugins`` is installed, ``Trainer(accelerator="tpu")`` runs through it.

* **Data**: every ``.py`` file of the running interpreter's standard library
  (``sysconfig.get_paths()["stdlib"]``, third-party ``site-packages``/``dist-packages`` left out),
  in sorted order, read as bytes and joined: a vocabulary of the 256 byte values, no tokenizer and
  no download. A file goes to the validation split when the CRC-32 of its path relative to that
  folder is divisible by :data:`VALIDATION_EVERY`, so the split of a file does not depend on which
  other files exist. Both splits are cut into non-overlapping windows of ``block_size + 1`` bytes:
  the input is a window's first ``block_size`` bytes, the target the same shifted by one.
* **Model**: a decoder-only transformer (GPT-2's layout: token and position embeddings, pre-norm
  blocks of causal self-attention and an MLP of 4x the width, a final layer norm) whose output layer
  shares the token embedding's weight. ``scan_layers=True`` runs the blocks through torch_xla's
  ``torch_xla.experimental.scan_layers.scan_layers`` (one compiled block reused for every layer)
  instead of a Python loop.

Run it as a script (the ``if __name__ == "__main__"`` guard is needed for XLA's multi-device launch)::

    python examples/gpt_stdlib.py                                   # one device, a few minutes on 2 CPU cores
    PJRT_DEVICE=CPU CPU_NUM_DEVICES=4 python examples/gpt_stdlib.py --strategy xla_spmd --devices 4

It prints the training and validation loss at each validation (every ``--val-every`` steps), then
a sample generated from ``--prompt`` by the trained model, and as its last line::

    val_loss=<float> bits_per_byte=<float> steps=<int> tied=<True|False>

``tied`` says whether the output layer still shares the token embedding's weight after ``fit``.
"""

from __future__ import annotations

import argparse
import math
import sys
import sysconfig
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import lightning as L
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

#: Byte values: the vocabulary.
VOCAB_SIZE = 256
#: A file whose relative path's CRC-32 is divisible by this goes to the validation split (about 1 in 20).
VALIDATION_EVERY = 20
#: Folders of third-party packages inside some interpreters' standard-library folder.
THIRD_PARTY = frozenset({"site-packages", "dist-packages"})


def stdlib_sources(root: Path | None = None) -> list[Path]:
    """The standard library's ``.py`` files, sorted by their path relative to ``root``.

    Args:
        root: the standard-library folder; default ``sysconfig.get_paths()["stdlib"]`` of this interpreter.

    Raises:
        FileNotFoundError: no ``.py`` file under ``root``.
    """
    root = Path(sysconfig.get_paths()["stdlib"]) if root is None else root
    files = sorted(
        (path for path in root.rglob("*.py") if not THIRD_PARTY & set(path.relative_to(root).parts)),
        key=lambda path: path.relative_to(root).as_posix(),
    )
    if not files:
        raise FileNotFoundError(f"no .py file under {root}")
    return files


def is_validation(relative: str) -> bool:
    """Whether the file at ``relative`` (a POSIX path relative to the standard-library folder) is held out."""
    return zlib.crc32(relative.encode()) % VALIDATION_EVERY == 0


def stdlib_bytes(root: Path | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The training and validation text: the files of :func:`stdlib_sources` joined, as ``uint8`` tensors."""
    root = Path(sysconfig.get_paths()["stdlib"]) if root is None else root
    splits: dict[bool, list[bytes]] = {False: [], True: []}
    for path in stdlib_sources(root):
        splits[is_validation(path.relative_to(root).as_posix())].append(path.read_bytes())
    train, val = (bytearray(b"".join(splits[held_out])) for held_out in (False, True))
    return torch.frombuffer(train, dtype=torch.uint8), torch.frombuffer(val, dtype=torch.uint8)


class ByteWindows(Dataset):
    """Non-overlapping windows of a byte sequence: item ``i`` is ``(x, y)``, ``y`` being ``x`` shifted by one byte.

    Args:
        data: 1-D ``uint8`` tensor.
        block_size: bytes in ``x`` (and in ``y``); each window spans ``block_size + 1`` bytes.

    Raises:
        ValueError: ``data`` is shorter than one window.
    """

    def __init__(self, data: torch.Tensor, block_size: int) -> None:
        if data.numel() < block_size + 1:
            raise ValueError(f"{data.numel()} bytes are fewer than one window of {block_size + 1}")
        self.data = data
        self.block_size = block_size

    def __len__(self) -> int:
        return (self.data.numel() - 1) // self.block_size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} out of range(0, {len(self)})")
        window = self.data[index * self.block_size : (index + 1) * self.block_size + 1].long()
        return window[:-1], window[1:]


class StdlibBytes(L.LightningDataModule):
    """The standard library's source as training and validation windows (see the module's docstring).

    Both loaders drop their last partial batch: every batch has the shape ``(batch_size, block_size)``,
    so XLA compiles one graph per step kind.

    Args:
        block_size: bytes of context per sample.
        batch_size: samples per batch (per device on the multi-device strategies).
        root: the standard-library folder (default: this interpreter's).
    """

    def __init__(self, block_size: int = 128, batch_size: int = 16, root: Path | None = None) -> None:
        super().__init__()
        self.block_size = block_size
        self.batch_size = batch_size
        self.root = root
        self.train: ByteWindows | None = None
        self.val: ByteWindows | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.train is None:
            train, val = stdlib_bytes(self.root)
            self.train, self.val = ByteWindows(train, self.block_size), ByteWindows(val, self.block_size)

    def train_dataloader(self) -> DataLoader:
        self.setup()
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        self.setup()
        return DataLoader(self.val, batch_size=self.batch_size, drop_last=True)


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of :class:`GPT`; ``n_embd`` must divide by ``n_head``."""

    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    scan_layers: bool = False


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where each position attends to itself and earlier positions only."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if config.n_embd % config.n_head:
            raise ValueError(f"n_embd={config.n_embd} does not divide by n_head={config.n_head}")
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, width = x.shape
        q, k, v = (
            t.view(batch, time, self.n_head, width // self.n_head).transpose(1, 2)
            for t in self.qkv(x).split(width, dim=2)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, time, width))


class Block(nn.Module):
    """A pre-norm transformer block: ``x + attention(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(config.n_embd, 4 * config.n_embd), nn.GELU(), nn.Linear(4 * config.n_embd, config.n_embd)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """A decoder-only transformer over bytes whose output layer is tied to the token embedding.

    ``forward(idx)`` maps byte ids ``(batch, time)`` (``time <= block_size``, int64) to logits
    ``(batch, time, 256)``. Weights start as GPT-2's: normal with standard deviation 0.02, biases 0.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(VOCAB_SIZE, config.n_embd)
        self.pos_emb = nn.Embedding(config.block_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, VOCAB_SIZE, bias=False)
        self.tie_weights()
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def tie_weights(self) -> None:
        """Make the output layer use the token embedding's weight (again).

        ``Module.to`` an XLA device gives each module a new parameter of its own (torch cannot swap
        an XLA tensor into a CPU parameter in place), so a tie made on the CPU does not survive the
        move: call this after moving the model yourself. Lightning's XLA strategies re-tie after
        their move (``find_shared_parameters``/``set_shared_parameters``).
        """
        self.lm_head.weight = self.tok_emb.weight

    @property
    def tied(self) -> bool:
        """Whether the output layer's weight is the token embedding's weight (one parameter, not a copy)."""
        return self.lm_head.weight is self.tok_emb.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(positions)
        if self.config.scan_layers:
            from torch_xla.experimental.scan_layers import scan_layers

            x = scan_layers(self.blocks, x)
        else:
            for block in self.blocks:
                x = block(x)
        return self.lm_head(self.ln_f(x))


def lm_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``model``'s next-byte predictions for inputs ``x`` against targets ``y``, in nats."""
    return F.cross_entropy(model(x).reshape(-1, VOCAB_SIZE), y.reshape(-1))


@torch.no_grad()
def generate(model: GPT, prompt: bytes, new_bytes: int, temperature: float = 0.8, seed: int = 0) -> bytes:
    """``prompt`` followed by ``new_bytes`` bytes sampled from ``model`` (on the model's device; meant for CPU).

    Each byte is drawn from the softmax of the last position's logits divided by ``temperature``,
    with a ``torch.Generator`` seeded with ``seed``; the context is cut to the model's ``block_size``.
    """
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    idx = torch.tensor([list(prompt)], dtype=torch.long, device=device)
    was_training = model.training
    model.eval()
    for _ in range(new_bytes):
        logits = model(idx[:, -model.config.block_size :])[:, -1] / temperature
        idx = torch.cat([idx, torch.multinomial(logits.softmax(-1), 1, generator=generator)], dim=1)
    model.train(was_training)
    return bytes(idx[0].tolist())


class GPTModule(L.LightningModule):
    """:class:`GPT` trained with AdamW on next-byte cross-entropy; logs ``train_loss`` and ``val_loss``.

    Args:
        lr: AdamW's learning rate (constant).
        weight_decay: AdamW's weight decay, applied to matrices only (not to biases and layer norms).
        **config: the fields of :class:`GPTConfig`.
    """

    def __init__(self, lr: float = 2e-3, weight_decay: float = 0.1, **config: object) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = GPT(GPTConfig(**config))  # type: ignore[arg-type]

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = lm_loss(self.model, *batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", lm_loss(self.model, *batch), prog_bar=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return adamw(self.model, self.hparams.lr, self.hparams.weight_decay)


def adamw(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW over ``model``'s parameters, decaying those with two or more dimensions only (GPT-2's grouping)."""
    params = list(model.parameters())  # a tied weight once
    return torch.optim.AdamW(
        [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=lr,
    )


class PrintLosses(L.Callback):
    """Prints the step, the last training loss and the validation loss when a validation ends.

    Reads the values Lightning already gathered for the progress bar (``trainer.callback_metrics``)
    at the end of a validation, where the loop reads the device anyway: no read inside a step.
    """

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        metrics = trainer.callback_metrics
        train = float(metrics["train_loss"]) if "train_loss" in metrics else float("nan")
        val = float(metrics["val_loss"])
        pl_module.print(
            f"step {trainer.global_step}: train_loss={train:.4f} val_loss={val:.4f}"
            f" bits_per_byte={val / math.log(2):.3f}"
        )
        sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = GPTConfig()
    parser.add_argument("--accelerator", default="tpu", help="Trainer(accelerator=...) (default: %(default)s)")
    parser.add_argument("--strategy", default="auto", help="single_xla, xla_spmd, xla_fsdp_v2, ... (%(default)s)")
    parser.add_argument("--devices", default="1", help="Trainer(devices=...) (default: %(default)s)")
    parser.add_argument("--precision", default="32-true", help="Trainer(precision=...) (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps (default: %(default)s)")
    parser.add_argument("--val-every", type=int, default=100, help="steps between validations (default: %(default)s)")
    parser.add_argument("--val-batches", type=int, default=8, help="batches a validation (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=16, help="per device (default: %(default)s)")
    parser.add_argument("--block-size", type=int, default=defaults.block_size, help="(default: %(default)s)")
    parser.add_argument("--n-layer", type=int, default=defaults.n_layer, help="(default: %(default)s)")
    parser.add_argument("--n-head", type=int, default=defaults.n_head, help="(default: %(default)s)")
    parser.add_argument("--n-embd", type=int, default=defaults.n_embd, help="(default: %(default)s)")
    parser.add_argument("--scan-layers", action="store_true", help="run the blocks with torch_xla's scan_layers")
    parser.add_argument("--lr", type=float, default=2e-3, help="AdamW's learning rate (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    parser.add_argument("--prompt", default="def ", help="start of the generated sample (default: %(default)r)")
    parser.add_argument("--sample-bytes", type=int, default=200, help="bytes generated, 0 for none (%(default)s)")
    args = parser.parse_args(argv)

    L.seed_everything(args.seed, verbose=False)
    config = GPTConfig(args.block_size, args.n_layer, args.n_head, args.n_embd, args.scan_layers)
    model = GPTModule(lr=args.lr, **asdict(config))
    data = StdlibBytes(block_size=args.block_size, batch_size=args.batch_size)
    trainer = L.Trainer(
        accelerator=args.accelerator,
        strategy=args.strategy,
        devices=args.devices,
        precision=args.precision,
        max_steps=args.steps,
        val_check_interval=args.val_every,
        check_val_every_n_epoch=None,
        limit_val_batches=args.val_batches,
        num_sanity_val_steps=0,
        callbacks=[PrintLosses()],
        logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(model, datamodule=data)
    val_loss = float(trainer.callback_metrics["val_loss"])
    if args.sample_bytes:
        sample = generate(model.model.cpu(), args.prompt.encode(), args.sample_bytes, seed=args.seed)
        print("--- sample ---")
        print(sample.decode(errors="replace"))
        print("---")
    print(
        f"val_loss={val_loss:.4f} bits_per_byte={val_loss / math.log(2):.3f}"
        f" steps={trainer.global_step} tied={model.model.tied}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
