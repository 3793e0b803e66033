"""Fabric's scenarios for tests/scripts/fsdp_v2.py (``--api fabric``): the same model, data and clipping."""

from __future__ import annotations

import os

import lightning as L
import torch
from fsdp_v2 import BATCH, CLIP, spec
from fsdp_v2_net import Block, Net, data
from torch import nn
from torch.utils.data import DataLoader

EPOCH = -(-len(data()) // (BATCH * int(os.environ["CPU_NUM_DEVICES"])))  # steps per epoch


def fabric_run(strategy, epochs: int, setup: str = "joint", precision="32-true", save=None, load=None) -> dict:
    """Train ``epochs`` epochs; ``save``: (path, epoch) to save after; ``load``: a path to resume from first."""
    fabric = L.Fabric(accelerator="xla", devices="auto", strategy=strategy, precision=precision)
    fabric.launch()
    fabric.seed_everything(0)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)  # built on the CPU parameters
    if setup == "joint":
        model, optimizer = fabric.setup(model, optimizer)
    elif setup == "separate":
        model = fabric.setup_module(model)
        optimizer = fabric.setup_optimizers(optimizer)
    else:  # "after": the optimizer built anew from the set-up module
        model = fabric.setup_module(model)
        optimizer = fabric.setup_optimizers(torch.optim.Adam(model.parameters(), lr=1e-2))
    loader = fabric.setup_dataloaders(DataLoader(data(), batch_size=BATCH))
    state = {"model": model, "optimizer": optimizer, "step": 0}
    row: dict = {"losses": [], "norms": []}
    if load:
        fabric.load(load, state)
        weight_state = optimizer.state[model.block.linear.weight]
        row["start_step"] = state["step"]
        row["start_state_spec"] = spec(weight_state["exp_avg"])
    losses, norms = [], []
    for epoch in range(state["step"] // EPOCH, epochs):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            fabric.backward(loss)
            norms.append(fabric.clip_gradients(model, optimizer, max_norm=CLIP))
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.detach())
            state["step"] += 1
        if save and epoch + 1 == save[1]:
            fabric.save(save[0], state)
            fabric.strategy.wait_for_checkpoint_writes()  # written in the background; the report lists its files
    weight = model.block.linear.weight
    row.update(
        losses=[float(v) for v in losses],
        norms=[float(v) for v in norms],
        step=state["step"],
        weight_spec=spec(weight),
        weight_dtype=str(weight.dtype),
        state_spec=spec(optimizer.state[weight]["exp_avg"]),
        strategy=type(fabric.strategy).__name__,
    )
    return row


def fabric_scenarios(out: str) -> dict:
    from xla_plugins.strategies.xla_fsdp_v2 import FabricXLAFSDPv2Strategy

    report: dict = {}
    report["spmd"] = fabric_run("xla_spmd", 2)
    full = os.path.join(out, "full.ckpt")
    wrapped = FabricXLAFSDPv2Strategy(auto_wrap_policy={Block}, activation_checkpointing_policy={Block})
    report["fsdp"] = fabric_run(wrapped, 2, save=(full, 1))
    report["full_ckpt"] = full
    report["setup_module"] = fabric_run("xla_fsdp_v2", 1, setup="separate")
    report["setup_module_then_optimizer"] = fabric_run("xla_fsdp_v2", 1, setup="after")
    report["resumed_full"] = fabric_run("xla_fsdp_v2", 2, load=full)
    sharded = os.path.join(out, "sharded")
    report["sharded_first"] = fabric_run(FabricXLAFSDPv2Strategy(state_dict_type="sharded"), 1, save=(sharded, 1))
    report["sharded_ckpt"] = sorted(os.listdir(sharded))
    report["resumed_sharded"] = fabric_run(FabricXLAFSDPv2Strategy(state_dict_type="sharded"), 2, load=sharded)
    report["bf16-true"] = fabric_run("xla_fsdp_v2", 1, precision="bf16-true")

    fabric = L.Fabric(accelerator="xla", devices="auto", strategy="xla_fsdp_v2")
    fabric.launch()
    fabric.setup_module(Net())
    try:
        fabric.setup_optimizers(torch.optim.SGD(Net().parameters(), lr=0.1))  # parameters of another module
    except RuntimeError as error:
        report["stale_optimizer"] = str(error)
    return report
