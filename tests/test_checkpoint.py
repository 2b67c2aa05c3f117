"""Atomic checkpoints: valid ones are found, half-written ones never chosen."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from workbench.engine import checkpoint
from workbench.errors import CheckpointError


@pytest.fixture
def acc():
    """A real single-process Accelerator with a small model, optimizer and schedule prepared."""
    from accelerate import Accelerator

    from workbench.engine.distributed import reset_accelerate_state

    reset_accelerate_state()
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (step + 1))
    accelerator.model, accelerator.opt, accelerator.sched = accelerator.prepare(model, optimizer, scheduler)
    yield accelerator
    reset_accelerate_state()


def _train_one_step(acc):
    acc.backward(acc.model(torch.ones(4, 3)).sum())
    acc.opt.step()
    acc.sched.step()
    acc.opt.zero_grad()


def _save(acc, out, step, keep=None):
    with torch.no_grad():
        acc.model.weight.fill_(float(step))
    return checkpoint.save_checkpoint(acc, out, step, {"step": step}, {"seed": 1}, keep=keep)


def test_save_and_load_roundtrip(acc, tmp_path):
    _train_one_step(acc)  # AdamW moments and a schedule position worth restoring
    path = _save(acc, tmp_path, 7)
    assert path.name == "step-000007"
    assert checkpoint.validate(path) is None
    saved_moments = acc.opt.state_dict()["state"][0]["exp_avg"].clone()
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    _train_one_step(acc)
    with torch.no_grad():
        acc.model.weight.zero_()
    state, record = checkpoint.load_checkpoint(acc, path)
    assert acc.model.weight.tolist() == [[7.0, 7.0, 7.0]]
    assert torch.equal(acc.opt.state_dict()["state"][0]["exp_avg"], saved_moments)
    assert acc.sched.scheduler.last_epoch == 1
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected  # RNG streams restored
    assert state == {"step": 7} and record == {"seed": 1}
    assert not any(p.name.startswith(".tmp-") for p in path.parent.iterdir())


def test_a_checkpoint_of_an_older_format_is_not_resumed(acc, tmp_path):
    path = _save(acc, tmp_path, 3)
    manifest = json.loads((path / checkpoint.MANIFEST).read_text())
    manifest["format"] = 1
    (path / checkpoint.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="another workbench version") as info:
        checkpoint.load_checkpoint(acc, path)
    assert "resume=None" in info.value.fix


def test_newest_valid_checkpoint_wins_and_broken_ones_are_skipped(acc, tmp_path):
    _save(acc, tmp_path, 2)
    _save(acc, tmp_path, 4)
    newest = _save(acc, tmp_path, 6)
    # A crash mid-save: files written, no manifest yet (would be a .tmp- dir; be harsher).
    (newest / checkpoint.MANIFEST).unlink()
    with pytest.warns(UserWarning, match="step-000006"):
        assert checkpoint.latest_checkpoint(tmp_path).name == "step-000004"
    # A truncated file: sizes no longer match the manifest.
    model_file = tmp_path / "checkpoints" / "step-000004" / "model.safetensors"
    model_file.write_bytes(model_file.read_bytes()[:10])
    with pytest.warns(UserWarning):
        assert checkpoint.latest_checkpoint(tmp_path).name == "step-000002"


def test_temporary_folders_are_never_chosen_and_get_cleaned(acc, tmp_path):
    _save(acc, tmp_path, 2)
    stale = tmp_path / "checkpoints" / ".tmp-step-000004-123"
    stale.mkdir()
    (stale / "model.pt").write_bytes(b"partial")
    assert checkpoint.latest_checkpoint(tmp_path).name == "step-000002"
    checkpoint.remove_stale_temporaries(tmp_path / "checkpoints")
    assert not stale.exists()


def test_only_the_newest_k_are_kept(acc, tmp_path):
    for step in (1, 2, 3, 4):
        _save(acc, tmp_path, step, keep=2)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["step-000003", "step-000004"]


# A process that prunes with each file's delete slowed down, so that a kill lands in the middle.
SLOW_PRUNE = """
import os, sys, time
from workbench.engine import checkpoint
unlink = os.unlink
def slow_unlink(*args, **kwargs):
    print("deleting", flush=True)
    time.sleep(0.05)
    return unlink(*args, **kwargs)
os.unlink = slow_unlink
checkpoint.prune(sys.argv[1], keep=1)
print("done", flush=True)
"""


def _fake_checkpoint(out, step: int, files: int = 40):
    """A valid step folder (its manifest lists its files) without the cost of a model."""
    folder = checkpoint.checkpoints_dir(out) / checkpoint.step_dir_name(step)
    folder.mkdir(parents=True)
    for i in range(files):
        (folder / f"shard-{i:03d}.bin").write_bytes(b"w" * 100)
    sizes = {p.name: p.stat().st_size for p in folder.iterdir()}
    (folder / checkpoint.MANIFEST).write_text(json.dumps({"format": checkpoint.FORMAT, "step": step,
                                                          "files": sizes, "complete": True}))


def test_a_kill_while_pruning_never_leaves_a_half_deleted_checkpoint(tmp_path):
    import signal
    import subprocess
    import sys

    for step in (1, 2, 3):
        _fake_checkpoint(tmp_path, step)
    proc = subprocess.Popen([sys.executable, "-c", SLOW_PRUNE, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "deleting"
    proc.send_signal(signal.SIGKILL)  # a few files of a 40-file checkpoint are gone
    proc.wait()
    root = checkpoint.checkpoints_dir(tmp_path)
    left = sorted(p.name for p in root.iterdir())
    assert left[-1] == "step-000003" and not any(name.startswith("step-00000") for name in left[:-1]), left
    assert any(name.startswith(".del-step-000001-") for name in left), left  # renamed away, then cut short
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path, warn=True)] == ["step-000003"]
    checkpoint.remove_stale_temporaries(root)  # what every run does at its start, under its lock
    assert sorted(p.name for p in root.iterdir()) == ["step-000003"]


def test_resaving_a_step_replaces_it(acc, tmp_path):
    _save(acc, tmp_path, 3)
    path = _save(acc, tmp_path, 3)
    assert checkpoint.validate(path) is None
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["step-000003"]


def test_resolve_resume(acc, tmp_path):
    assert checkpoint.resolve_resume(tmp_path, None) is None
    assert checkpoint.resolve_resume(tmp_path, "auto") is None  # nothing yet: start fresh
    path = _save(acc, tmp_path, 5)
    assert checkpoint.resolve_resume(tmp_path, "auto") == path
    assert checkpoint.resolve_resume(tmp_path, str(path)) == path
    with pytest.raises(CheckpointError, match="resume='auto'"):
        checkpoint.resolve_resume(tmp_path, str(tmp_path / "nope"))


def test_rng_state_roundtrip():
    state = checkpoint.rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.random(), np.random.rand(), torch.rand(1)
    checkpoint.set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_run_record_and_changes():
    record = checkpoint.run_record({"lr": 1}, seed=3, precision="fp32", world_size=1)
    env = record["environment"]
    assert env["packages"]["torch"] and "gpu_count" in env and "cudnn" in env
    json.dumps(record)  # serialisable as run.json
    changed = json.loads(json.dumps(record))
    changed["environment"]["packages"]["torch"] = "0.0.1"
    changed["environment"]["gpu_model"] = "NVIDIA H100"
    changes = checkpoint.compare_records(changed, record)
    assert any(c.startswith("torch 0.0.1 ->") for c in changes)
    assert any(c.startswith("gpu_model NVIDIA H100 ->") for c in changes)
    assert checkpoint.compare_records(record, record) == []


def test_unwritable_location_is_a_checkpoint_error(acc, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CheckpointError, match="output_dir"):
        _save(acc, blocker, 1)
