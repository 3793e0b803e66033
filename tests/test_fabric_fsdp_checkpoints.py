"""Fabric's `xla_fsdp_v2` checkpoints hold every stateful object as its state, in both formats (issue: with
`state_dict_type="sharded"`, `fabric.save(path, {"model", "optimizer", "scheduler"})` failed to pickle the
scheduler, which holds the wrapped optimizer, and the load then failed)."""

from __future__ import annotations

import json

import pytest
from conftest import run_python

pytestmark = pytest.mark.xla

SAVE = """
import json, torch, lightning as L, xla_plugins
fabric = L.Fabric(accelerator="tpu", devices=4, strategy=xla_plugins.FabricXLAFSDPv2Strategy(state_dict_type=FORMAT))
fabric.launch()
fabric.seed_everything(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
model, optimizer = fabric.setup(model, optimizer)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
for _ in range(3):
    loss = model(torch.randn(16, 8, device=fabric.device)).square().mean()
    fabric.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()
fabric.save(PATH, {"model": model, "optimizer": optimizer, "scheduler": scheduler, "step": 3})
print(json.dumps({"weights": [x for p in model.parameters() for x in p.detach().cpu().flatten().tolist()],
                  "scheduler": [scheduler.last_epoch, scheduler.get_last_lr()]}))
"""

LOAD = """
import json, torch, lightning as L, xla_plugins
fabric = L.Fabric(accelerator="tpu", devices=4, strategy=xla_plugins.FabricXLAFSDPv2Strategy(state_dict_type=FORMAT))
fabric.launch()
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
model, optimizer = fabric.setup(model, optimizer)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "step": 0}
fabric.load(PATH, state)
print(json.dumps({"weights": [x for p in model.parameters() for x in p.detach().cpu().flatten().tolist()],
                  "scheduler": [scheduler.last_epoch, scheduler.get_last_lr()], "step": state["step"],
                  "lr": optimizer.param_groups[0]["lr"], "same_scheduler": state["scheduler"] is scheduler}))
"""


@pytest.mark.slow  # several devices: primary tox cell only (tox.ini)
@pytest.mark.parametrize("state_dict_type", ["full", "sharded"])
def test_fabric_saves_and_loads_a_scheduler_in_a_new_process(state_dict_type, tmp_path):
    env = {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"}
    head = f"FORMAT = {state_dict_type!r}\nPATH = {str(tmp_path / 'checkpoint')!r}\n"
    saved = json.loads(run_python(head + SAVE, env=env, timeout=600).stdout.splitlines()[-1])
    loaded = json.loads(run_python(head + LOAD, env=env, timeout=600).stdout.splitlines()[-1])
    assert loaded["weights"] == pytest.approx(saved["weights"], abs=1e-6)
    assert loaded["scheduler"] == saved["scheduler"] == [3, [0.1 * 0.5**3]]
    assert loaded["lr"] == pytest.approx(0.1 * 0.5**3)  # the optimizer's own state came back too
    assert loaded["step"] == 3 and loaded["same_scheduler"] is True  # restored in place
