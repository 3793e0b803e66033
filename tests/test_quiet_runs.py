"""What a short `xla_fsdp_v2` run prints to stderr: Lightning's and the plugin's lines, no warning from the
strategies' own calls into torch and torch_xla (a newcomer counted 287 lines, 275 of them XLA's notice), and one
short line of the plugin's at the end of each fit."""

from __future__ import annotations

import pytest
from conftest import run_python

pytestmark = pytest.mark.xla

SCRIPT = """
import torch, lightning as L, xla_plugins
from torch.utils.data import DataLoader, TensorDataset

class TokenModel(L.LightningModule):  # integer inputs: no input requires a gradient
    def __init__(self):
        super().__init__()
        self.embedding, self.head = torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16)

    def training_step(self, batch, batch_idx):
        tokens = batch[0]
        return torch.nn.functional.cross_entropy(self.head(self.embedding(tokens)), tokens)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters())

def fit(steps, root, ckpt_path=None):
    data = DataLoader(TensorDataset(torch.randint(0, 16, (64,))), batch_size=4)
    trainer = L.Trainer(accelerator="tpu", devices=4, strategy=xla_plugins.XLAFSDPv2Strategy(state_dict_type="sharded"),
                        max_steps=steps, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=root)
    trainer.fit(TokenModel(), data, ckpt_path=ckpt_path)
    return trainer.checkpoint_callback.best_model_path or trainer.checkpoint_callback.last_model_path

saved = fit(4, ROOT + "/first")  # one sharded save at the end of the fit (ModelCheckpoint)
fit(8, ROOT + "/second", ckpt_path=saved)  # a sharded load, then more steps and another save
"""

#: The lines Lightning and the plugin print on purpose (the plugin's start-up and batch lines, Lightning's
#: device summary, tips and stop reason).
EXPECTED = (
    "trainer-plugins: ",
    "GPU available: ",
    "TPU available: ",
    "💡 Tip: ",
    "`Trainer.fit` stopped: ",
    "Restoring states from the checkpoint path at ",
    "Restored all states from the checkpoint at ",
)
GSPMD_NOTICE = "GSPMD sharding propagation is going to be deprecated"


@pytest.mark.slow  # several devices: primary tox cell only (tox.ini)
def test_a_short_fsdp_run_prints_no_warning_of_the_strategys_own_calls(tmp_path):
    script = f"ROOT = {str(tmp_path)!r}\n" + SCRIPT
    result = run_python(script, env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"}, timeout=600)
    lines = result.stderr.splitlines()
    ours = [line for line in lines if GSPMD_NOTICE not in line]
    # Lightning's own warnings about the user's set-up (here: the resumed run's checkpoint directory) may stay
    lightning = [line for line in ours if "/lightning/pytorch/" in line]
    # one short line of ours at the end of each fit (before: a 10-line goodput table and a 7-line compile summary)
    end = [line for line in ours if line.startswith("xla-plugins: ")]
    assert [line for line in ours if not line.startswith(EXPECTED) and line not in lightning + end] == []
    assert len(ours) - len(lightning) - len(end) <= 16  # two fits: start-up, batch, devices, tips, restore, stop
    assert [line.split(";")[0] for line in end] == [
        "xla-plugins: fit ended at trainer.global_step=4",
        "xla-plugins: fit ended at trainer.global_step=8",
    ]
    assert all(len(line) <= 160 for line in end), end
    assert any(GSPMD_NOTICE in line for line in lines)  # XLA's C++ notice, one per SPMD compilation
    # the documented way to quiet XLA's C++ warnings (the notice among them)
    quiet = run_python(
        script, env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4", "TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=600
    )
    assert [line for line in quiet.stderr.splitlines() if GSPMD_NOTICE in line] == []
