"""FSDP resume restores the optimizer's moments (Accelerate saves the sharded optimizer state).

The engine runs FSDP2 (engine/distributed.fsdp_plugin): each rank writes its shards through
torch.distributed.checkpoint into pytorch_model_fsdp_0/ and optimizer_0/. Under FSDP1 this test
failed with KeyError in torch's _unflatten_param_groups (issue 32).

Accelerate uses FSDP only on GPUs (a CPU/gloo run ignores the plugin), so this runs
where CUDA is: one torchrun process per GPU, a run interrupted after step 4 and
resumed to step 8 must end with the weights of the uninterrupted run. Were AdamW's
moments restarted at the resume, steps 5-8 would move the weights differently.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu

WORKER = r'''
import sys
from safetensors.torch import save_file
import workbench.engine.train as engine
from workbench.sources.synthetic import make_dataset

out, stop_at, weights = sys.argv[1], int(sys.argv[2]), sys.argv[3]
original, original_stop = engine._save_model, engine._stop_requested
engine._stop_requested = lambda run, step: step == stop_at or original_stop(run, step)  # a pause at stop_at

def save_and_keep_weights(run, directory, extra=None):
    result = original(run, directory, extra)
    state = run.accelerator.get_state_dict(run.model)  # every rank: FSDP gathers
    if run.accelerator.is_main_process and directory.name == "model":
        save_file({k: v.contiguous().cpu() for k, v in state.items()}, weights)
    return result

engine._save_model = save_and_keep_weights
engine.fit(sys.argv[4], make_dataset(128, 32, seed=2), output_dir=out, distributed="fsdp", precision="fp32",
           learning_rate=2e-3, batch_size=8, max_steps=8, save_every=4, log_every=1, num_workers=0)
'''


def _torchrun(script, *args):
    nproc = str(max(1, torch.cuda.device_count()))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           nproc, str(script), *map(str, args)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_fsdp_resume_restores_the_optimizer_state(tiny_bert, tmp_path):
    from safetensors.torch import load_file

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    _torchrun(script, tmp_path / "straight", 0, tmp_path / "straight.safetensors", tiny_bert)
    _torchrun(script, tmp_path / "resumed", 4, tmp_path / "first-half.safetensors", tiny_bert)  # paused at 4
    saved = sorted(p.name for p in (tmp_path / "resumed" / "checkpoints" / "step-000004").iterdir())
    assert "optimizer_0" in saved and "pytorch_model_fsdp_0" in saved, saved  # DCP shards, FSDP2's layout
    _torchrun(script, tmp_path / "resumed", 0, tmp_path / "resumed.safetensors", tiny_bert)
    straight, resumed = load_file(tmp_path / "straight.safetensors"), load_file(tmp_path / "resumed.safetensors")
    for name, tensor in straight.items():
        torch.testing.assert_close(resumed[name], tensor, atol=1e-5, rtol=1e-4)
