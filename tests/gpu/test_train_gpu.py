"""fit() on a real NVIDIA GPU: fp16 with the loss scaler, bf16, and what `auto` picks.

Skipped without CUDA (see tests/conftest.py). A few steps each; well under 60 s.
"""

from __future__ import annotations

import json

import pytest
import torch

from workbench.engine import checkpoint
from workbench.engine.precision import device_facts, resolve_precision
from workbench.frontend import fit
from workbench.sources.synthetic import make_dataset

pytestmark = pytest.mark.gpu


def _fit(tiny_bert, out, precision):
    return fit(str(tiny_bert), make_dataset(128, 32), output_dir=str(out), precision=precision,
               learning_rate=2e-3, batch_size=16, max_steps=8, log_every=1, save_every=4,
               num_workers=0, progress="none")


def test_auto_picks_bf16_on_ampere_and_newer():
    major, _ = torch.cuda.get_device_capability()
    facts = device_facts()
    assert facts.cuda and facts.bf16 == (major >= 8)
    assert resolve_precision("auto") == ("bf16" if major >= 8 else "fp16")


def test_fp16_trains_with_the_grad_scaler(tiny_bert, tmp_path):
    result = _fit(tiny_bert, tmp_path / "fp16", "fp16")
    assert result.status == "completed"
    train = [e for e in result.history if e["kind"] == "train"]
    assert len(train) == 8
    assert all(e["gpu_mem_bytes"] and e["gpu_mem_bytes"] > 0 for e in train)
    assert all(e["loss"] == e["loss"] for e in train)  # no NaN
    # The GradScaler's state is part of every checkpoint, so a resume continues its scale.
    last = checkpoint.latest_checkpoint(tmp_path / "fp16")
    assert (last / "scaler.pt").is_file()
    scaler = torch.load(last / "scaler.pt", weights_only=True)
    assert scaler["scale"] > 0
    state = json.loads((last / "state.json").read_text())
    assert state["skipped_steps"] == train[-1]["skipped_steps"]


def test_bf16_trains_without_a_scaler(tiny_bert, tmp_path):
    result = _fit(tiny_bert, tmp_path / "bf16", "bf16")
    assert result.status == "completed"
    start = next(e for e in result.history if e["kind"] == "start")
    assert start["precision"] == "bf16" and start["device"].startswith("cuda")
    assert not (checkpoint.latest_checkpoint(tmp_path / "bf16") / "scaler.pt").exists()
    assert all(e["skipped_steps"] == 0 for e in result.history if e["kind"] == "train")


def test_resume_on_gpu_continues(tiny_bert, tmp_path):
    out = tmp_path / "resume"
    _fit(tiny_bert, out, "auto")
    again = fit(str(tiny_bert), make_dataset(128, 32), output_dir=str(out), precision="auto",
                learning_rate=2e-3, batch_size=16, max_steps=10, log_every=1, num_workers=2, progress="none")
    assert [e["step"] for e in again.history if e["kind"] == "train"] == [9, 10]
