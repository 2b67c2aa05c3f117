"""Atomic checkpoints: valid ones are found, half-written ones never chosen."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from workbench import checkpoint
from workbench.errors import CheckpointError


def _save(out, step, keep=None):
    objects = {"model": {"w": torch.full((3,), float(step))}, "rng": checkpoint.rng_state()}
    return checkpoint.save_checkpoint(out, step, objects, {"step": step}, {"seed": 1}, keep=keep)


def test_save_and_load_roundtrip(tmp_path):
    path = _save(tmp_path, 7)
    assert path.name == "step-000007"
    assert checkpoint.validate(path) is None
    objects, state, record = checkpoint.load_checkpoint(path, ("model", "rng", "optimizer"))
    assert objects["model"]["w"].tolist() == [7.0, 7.0, 7.0]
    assert "optimizer" not in objects  # absent files are simply not loaded
    assert state == {"step": 7} and record == {"seed": 1}
    assert not any(p.name.startswith(".tmp-") for p in path.parent.iterdir())


def test_newest_valid_checkpoint_wins_and_broken_ones_are_skipped(tmp_path):
    _save(tmp_path, 2)
    _save(tmp_path, 4)
    newest = _save(tmp_path, 6)
    # A crash mid-save: files written, no manifest yet (would be a .tmp- dir; be harsher).
    (newest / checkpoint.MANIFEST).unlink()
    with pytest.warns(UserWarning, match="step-000006"):
        assert checkpoint.latest_checkpoint(tmp_path).name == "step-000004"
    # A truncated file: sizes no longer match the manifest.
    model_file = tmp_path / "checkpoints" / "step-000004" / "model.pt"
    model_file.write_bytes(model_file.read_bytes()[:10])
    with pytest.warns(UserWarning):
        assert checkpoint.latest_checkpoint(tmp_path).name == "step-000002"


def test_temporary_folders_are_never_chosen_and_get_cleaned(tmp_path):
    _save(tmp_path, 2)
    stale = tmp_path / "checkpoints" / ".tmp-step-000004-123"
    stale.mkdir()
    (stale / "model.pt").write_bytes(b"partial")
    assert checkpoint.latest_checkpoint(tmp_path).name == "step-000002"
    checkpoint.remove_stale_temporaries(tmp_path / "checkpoints")
    assert not stale.exists()


def test_only_the_newest_k_are_kept(tmp_path):
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, keep=2)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["step-000003", "step-000004"]


def test_resaving_a_step_replaces_it(tmp_path):
    _save(tmp_path, 3)
    path = _save(tmp_path, 3)
    assert checkpoint.validate(path) is None
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["step-000003"]


def test_resolve_resume(tmp_path):
    assert checkpoint.resolve_resume(tmp_path, None) is None
    assert checkpoint.resolve_resume(tmp_path, "auto") is None  # nothing yet: start fresh
    path = _save(tmp_path, 5)
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


def test_unwritable_location_is_a_checkpoint_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CheckpointError, match="output_dir"):
        _save(blocker, 1)
