"""Exact resume after kill -9: mid-run and in the middle of writing a checkpoint.

Each run is a real subprocess. On CPU with num_workers=0 the resumed run must
reproduce the uninterrupted run's losses (1e-6) and final weights, bit for bit.
The runs use bf16 autocast, what precision="auto" picks on CPUs with bf16 instructions
(asked for explicitly, so a CPU without them runs it too, emulated): the fp32 master
weights, AdamW state and RNG streams in the checkpoint make bf16 resume as exact as fp32.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from workbench.engine import checkpoint

WORKER = r'''
import os, sys, time
import torch
torch.set_num_threads(1)
import accelerate
import workbench.engine.events as events
from workbench.sources.synthetic import make_dataset
from workbench.engine.train import fit

pause = os.environ.get("PAUSE_IN_SAVE")  # "<step>:<flag file>": stall inside that step's checkpoint
if pause:  # the files are written, the manifest is not: the checkpoint is half on disk
    pause_step, flag = pause.split(":", 1)
    original_save_state = accelerate.Accelerator.save_state
    def save_state(self, output_dir=None, **kwargs):
        saved = original_save_state(self, output_dir, **kwargs)
        if os.path.basename(output_dir) == f".tmp-step-{int(pause_step):06d}":
            with open(flag, "w") as f:
                f.write(output_dir)
            time.sleep(60)
        return saved
    accelerate.Accelerator.save_state = save_state

slow_loss = float(os.environ.get("SLOW_LOSS_S", "0"))
if slow_loss:  # a pause inside each step, after the forward pass drew its dropout masks
    from workbench.tasks.classification import ClassificationTask
    original_loss = ClassificationTask.loss
    def loss(self, model, batch):
        value = original_loss(self, model, batch)
        time.sleep(slow_loss)
        return value
    ClassificationTask.loss = loss

slow = float(os.environ.get("SLOW_STEP_S", "0"))
if slow:  # make the run long enough to be killed part-way
    original = events.EventLog.write
    def write(self, kind, **fields):
        if kind == "train":
            time.sleep(slow)
        return original(self, kind, **fields)
    events.EventLog.write = write

result = fit(sys.argv[1], make_dataset(96, 32, seed=7), output_dir=sys.argv[2], learning_rate=2e-3,
             batch_size=8, max_steps=20, save_every=3, log_every=1, keep_checkpoints=2,
             num_workers=0, warmup_ratio=0.1, precision="bf16", compile=os.environ.get("COMPILE") == "1")
print("STATUS", result.status)
'''

STEPS = 20


def _run(script, model, out, env=None, wait=True):
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.Popen([sys.executable, str(script), str(model), str(out)], env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if wait:
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, output[-3000:]
        assert "STATUS completed" in output
    return proc


def _losses(out: Path) -> dict[int, float]:
    """Loss per step; after a resume the later (resumed) value of a step wins."""
    losses = {}
    for line in (out / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["kind"] == "train":
            losses[event["step"]] = event["loss"]
    return losses


def _weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(out / "model" / "model.safetensors")


def _wait_for(predicate, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise AssertionError(f"worker exited early: {proc.stdout.read()[-3000:]}")
        time.sleep(0.05)
    raise AssertionError("timed out waiting for the worker")


@pytest.fixture(scope="module")
def reference(tiny_bert, tmp_path_factory):
    base = tmp_path_factory.mktemp("resume")
    script = base / "worker.py"
    script.write_text(WORKER)
    out = base / "uninterrupted"
    _run(script, tiny_bert, out)
    start = json.loads((out / "events.jsonl").read_text().splitlines()[0])
    assert start["kind"] == "start" and start["precision"] == "bf16"
    return script, out


def _assert_same_as_reference(reference_out: Path, out: Path, resumed_after: int):
    ref, got = _losses(reference_out), _losses(out)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in range(resumed_after + 1, STEPS + 1):
        assert got[step] == pytest.approx(ref[step], abs=1e-6), step
    ref_w, got_w = _weights(reference_out), _weights(out)
    assert ref_w.keys() == got_w.keys()
    for name in ref_w:
        assert torch.equal(got_w[name], ref_w[name]), name  # bit-exact, not merely close


def test_kill_mid_run_then_resume_matches(reference, tiny_bert, tmp_path):
    script, ref_out = reference
    out = tmp_path / "killed"
    proc = _run(script, tiny_bert, out, env={"SLOW_STEP_S": "0.15"}, wait=False)
    _wait_for(lambda: len(_losses(out)) >= 8 if (out / "events.jsonl").exists() else False, proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    resume_from = checkpoint.latest_checkpoint(out)
    assert resume_from is not None
    resumed_after = int(resume_from.name.split("-")[1])
    assert 3 <= resumed_after < STEPS
    _run(script, tiny_bert, out)
    _assert_same_as_reference(ref_out, out, resumed_after)


def test_kill_during_a_save_leaves_the_previous_checkpoint(reference, tiny_bert, tmp_path):
    script, ref_out = reference
    out = tmp_path / "killed-in-save"
    flag = tmp_path / "saving"
    proc = _run(script, tiny_bert, out, env={"PAUSE_IN_SAVE": f"9:{flag}"}, wait=False)
    _wait_for(flag.exists, proc)
    partial = Path(flag.read_text())
    assert partial.is_dir() and partial.name.startswith(".tmp-step-000009")
    proc.send_signal(signal.SIGKILL)  # half of step 9's checkpoint is on disk
    proc.communicate()
    assert checkpoint.latest_checkpoint(out).name == "step-000006"
    _run(script, tiny_bert, out)
    assert not partial.exists()  # the half-written folder was cleaned up
    _assert_same_as_reference(ref_out, out, resumed_after=6)


def test_sigterm_finishes_the_step_saves_and_resumes_exactly(reference, tiny_bert, tmp_path):
    script, ref_out = reference
    out = tmp_path / "terminated"
    proc = _run(script, tiny_bert, out, env={"SLOW_STEP_S": "0.15"}, wait=False)
    _wait_for(lambda: len(_losses(out)) >= 4 if (out / "events.jsonl").exists() else False, proc)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output[-3000:]
    assert "STATUS interrupted" in output
    assert "Interrupted at step" in output and "Traceback" not in output
    stopped_at = max(_losses(out))
    assert checkpoint.latest_checkpoint(out).name == checkpoint.step_dir_name(stopped_at)
    _run(script, tiny_bert, out)
    _assert_same_as_reference(ref_out, out, resumed_after=stopped_at)


def test_double_ctrl_c_mid_step_still_resumes_exactly(reference, tiny_bert, tmp_path):
    """Two interrupts 0.3 s apart, landing inside a step after its dropout draws: the second
    is only noted, the step completes, one checkpoint and one message, then an exact resume."""
    script, ref_out = reference
    out = tmp_path / "double-interrupt"
    proc = _run(script, tiny_bert, out, env={"SLOW_LOSS_S": "0.4"}, wait=False)
    _wait_for(lambda: len(_losses(out)) >= 4 if (out / "events.jsonl").exists() else False, proc)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output[-3000:]
    assert "STATUS interrupted" in output and "Traceback" not in output
    assert output.count("Interrupted at step") == 1  # said once, not twice
    stopped_at = max(_losses(out))
    assert checkpoint.latest_checkpoint(out).name == checkpoint.step_dir_name(stopped_at)
    _run(script, tiny_bert, out)
    _assert_same_as_reference(ref_out, out, resumed_after=stopped_at)
