"""Checkpoints written off the training thread (engine/async_checkpoint.py).

(a) an asynchronous checkpoint holds exactly what a synchronous one of the same moment holds,
even when training draws random numbers and changes the weights while it is written;
(b) a run with async_checkpoints=True stopped by SIGTERM resumes bit-exactly;
(c) kill -9 while the writer thread is writing leaves the previous checkpoint, and the rerun
resumes from it bit-exactly, training having gone on while the save was stalled;
(d) what "auto" chooses. Runs are subprocesses, as in test_train_resume.py.
"""

from __future__ import annotations

import json
import random
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from test_train_resume import STEPS, _assert_same_as_reference, _losses, _run, _wait_for

from workbench.config import TrainConfig
from workbench.engine import async_checkpoint, checkpoint
from workbench.errors import ConfigError

WORKER = r'''
import os, sys, time
import torch
torch.set_num_threads(1)
import workbench.engine.async_checkpoint as async_checkpoint
import workbench.engine.events as events
from workbench.sources.synthetic import make_dataset
from workbench.engine.train import fit

stall = os.environ.get("STALL_WRITE")  # "<step>:<flag file>": the writer thread stalls after that step's files
if stall:
    stall_step, flag = stall.split(":", 1)
    original_write = async_checkpoint.write_snapshot
    def write_snapshot(snap, tmp):
        original_write(snap, tmp)
        if tmp.name == f".tmp-step-{int(stall_step):06d}":
            with open(flag, "w") as f:
                f.write(str(tmp))
            time.sleep(60)
    async_checkpoint.write_snapshot = write_snapshot

slow = float(os.environ.get("SLOW_STEP_S", "0"))
if slow:
    original = events.EventLog.write
    def write(self, kind, **fields):
        if kind == "train":
            time.sleep(slow)
        return original(self, kind, **fields)
    events.EventLog.write = write

result = fit(sys.argv[1], make_dataset(96, 32, seed=7), output_dir=sys.argv[2], learning_rate=2e-3,
             batch_size=8, max_steps=20, save_every=3, log_every=1, keep_checkpoints=2,
             num_workers=0, warmup_ratio=0.1, precision="bf16",
             async_checkpoints=os.environ.get("ASYNC") == "1")
print("STATUS", result.status)
'''


@pytest.fixture(scope="module")
def sync_reference(tiny_bert, tmp_path_factory):
    """An uninterrupted run with synchronous checkpoints: what every async run must reproduce."""
    base = tmp_path_factory.mktemp("async")
    script = base / "worker.py"
    script.write_text(WORKER)
    out = base / "uninterrupted"
    _run(script, tiny_bert, out)
    return script, out


def _events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------ (a) same contents
def _tiny_setup(tmp_path):
    """An Accelerator with a model (dropout), AdamW, a schedule and the task-weights hook of a task
    that keeps only some weights (as LoRA keeps the adapter's)."""
    from accelerate import Accelerator
    from transformers import get_linear_schedule_with_warmup

    class AdapterOnly:
        def model_state(self, model):
            return {k: v for k, v in model.state_dict().items() if k.startswith("2.")}

        def load_model_state(self, model, state):
            model.load_state_dict(state, strict=False)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    acc = Accelerator(cpu=True)
    model, optimizer = acc.prepare(model, optimizer)
    scheduler = acc.prepare(get_linear_schedule_with_warmup(optimizer, 2, 10))
    checkpoint.keep_task_weights(acc, AdapterOnly())

    def step():
        loss = model(torch.randn(4, 8)).pow(2).mean()
        acc.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()

    for _ in range(3):
        step()
    return acc, model, step


def _contents(path: Path) -> dict:
    from safetensors.torch import load_file

    return {"model": load_file(path / "model.safetensors"),
            "optimizer": torch.load(path / "optimizer.bin", weights_only=False),
            "scheduler": torch.load(path / "scheduler.bin", weights_only=False),
            "rng": torch.load(path / "random_states_0.pkl", weights_only=False)}


def _assert_equal(a, b, where="") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b.to(a.device)), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _assert_equal(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_equal(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b), where
    else:
        assert a == b, where


def test_async_checkpoint_holds_what_a_sync_one_holds(tmp_path):
    from workbench.engine import distributed

    acc, model, step = _tiny_setup(tmp_path)
    try:
        record, state = {"config": {}}, {"step": 3}
        sync = checkpoint.save_checkpoint(acc, tmp_path / "sync", 3, state, record)
        tmp = tmp_path / "async" / "checkpoints" / ".tmp-step-000003"
        snap = async_checkpoint.snapshot(acc, tmp)
        # Training goes on before the thread writes: new draws from every generator, new weights.
        random.random(), np.random.rand(), step()
        writer = async_checkpoint.Writer(on=True, reason="test")
        tmp.mkdir(parents=True)
        async_checkpoint.write_snapshot(snap, tmp)
        checkpoint._finish(tmp, tmp.parent / "step-000003", 3, state, record)
        done = tmp.parent / "step-000003"
        assert sorted(p.name for p in done.iterdir()) == sorted(p.name for p in sync.iterdir())
        expected, got = _contents(sync), _contents(done)
        assert set(expected["model"]) == {"2.weight", "2.bias"}  # the task's weights only
        _assert_equal(expected, got)
        # And the Writer, end to end: its folder loads with the unchanged load_checkpoint.
        path = writer.save(acc, tmp_path / "writer", 4, {"step": 4}, record, keep=1)
        assert writer.completed(wait=True) == [(4, path)]
        assert checkpoint.validate(path) is None
        before = {k: v.clone() for k, v in model.state_dict().items()}
        step()
        loaded_state, _ = checkpoint.load_checkpoint(acc, path)
        assert loaded_state == {"step": 4}
        assert torch.equal(model.state_dict()["2.weight"], before["2.weight"])
    finally:
        distributed.reset_accelerate_state()


def test_a_failed_background_write_raises_a_checkpoint_error_at_the_next_wait(tmp_path, monkeypatch):
    from workbench.engine import distributed
    from workbench.errors import CheckpointError

    acc, _, _ = _tiny_setup(tmp_path)
    try:
        def full_disk(snap, tmp):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(async_checkpoint, "write_snapshot", full_disk)
        writer = async_checkpoint.Writer(on=True, reason="test")
        writer.save(acc, tmp_path / "run", 3, {}, {}, keep=None)
        with pytest.raises(CheckpointError, match="Could not write checkpoint for step 3"):
            writer.completed(wait=True)
        assert writer.completed(wait=True) == []  # raised once
        assert not list((tmp_path / "run" / "checkpoints").iterdir())  # the half-written folder is gone
    finally:
        distributed.reset_accelerate_state()


# --------------------------------------------------------------- (b) exact resume
def test_async_run_stopped_by_sigterm_resumes_exactly(sync_reference, tiny_bert, tmp_path):
    script, ref_out = sync_reference
    out = tmp_path / "terminated"
    proc = _run(script, tiny_bert, out, env={"ASYNC": "1", "SLOW_STEP_S": "0.15"}, wait=False)
    _wait_for(lambda: len(_losses(out)) >= 4 if (out / "events.jsonl").exists() else False, proc)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "STATUS interrupted" in output, output[-3000:]
    stopped_at = max(_losses(out))
    assert checkpoint.latest_checkpoint(out).name == checkpoint.step_dir_name(stopped_at)
    events = _events(out)
    assert events[0]["async_checkpoints"]["on"] is True
    assert stopped_at in [e["step"] for e in events if e["kind"] == "checkpoint"]  # logged once committed
    _run(script, tiny_bert, out, env={"ASYNC": "1"})
    _assert_same_as_reference(ref_out, out, resumed_after=stopped_at)
    saved = [e["step"] for e in _events(out) if e["kind"] == "checkpoint"]
    assert saved[-1] == STEPS and all(checkpoint.validate(p) is None for p in checkpoint.list_checkpoints(out))


# ------------------------------------------------------- (c) kill -9 while writing
def test_kill_while_the_thread_writes_leaves_the_previous_checkpoint(sync_reference, tiny_bert, tmp_path):
    script, ref_out = sync_reference
    out = tmp_path / "killed-in-write"
    flag = tmp_path / "writing"
    proc = _run(script, tiny_bert, out, env={"ASYNC": "1", "STALL_WRITE": f"9:{flag}"}, wait=False)
    _wait_for(flag.exists, proc)
    # The writer is stalled with step 9's files half committed; training goes on to step 11 (step
    # 12's save then waits for this one).
    _wait_for(lambda: max(_losses(out), default=0) >= 11, proc)
    partial = Path(flag.read_text())
    assert partial.is_dir() and partial.name == ".tmp-step-000009"
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert checkpoint.latest_checkpoint(out).name == "step-000006"
    assert 9 not in [e["step"] for e in _events(out) if e["kind"] == "checkpoint"]  # never committed
    _run(script, tiny_bert, out, env={"ASYNC": "1"})
    assert not partial.exists()
    _assert_same_as_reference(ref_out, out, resumed_after=6)


# ------------------------------------------------------------------ (d) the choice
def test_auto_choice():
    choose = async_checkpoint.choose
    assert choose("auto", "cpu", 1, "ddp")[0] is False
    assert choose("auto", "cuda", 1, "ddp")[:2] == (True, "auto: CUDA, one process")
    assert choose("auto", "cuda", 2, "ddp")[0] is False
    assert choose("auto", "cuda", 1, "fsdp")[0] is False
    assert choose("auto", "cuda", 2, "ddp")[2] is None  # auto falls back without a message
    assert choose(True, "cpu", 1, "ddp")[0] is True
    assert choose(False, "cuda", 1, "ddp")[0] is False
    on, reason, note = choose(True, "cuda", 4, "ddp")
    assert not on and "4 processes" in reason and "4 processes" in note
    on, reason, note = choose(True, "cuda", 1, "fsdp")
    assert not on and "FSDP" in note


def test_setting_is_validated():
    assert TrainConfig(output_dir="x", async_checkpoints=True).async_checkpoints is True
    with pytest.raises(ConfigError, match="async_checkpoints"):
        TrainConfig(output_dir="x", async_checkpoints="yes")
