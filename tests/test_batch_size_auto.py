"""batch_size="auto" (engine/batch_size.py): the choice, the CPU fallback, a real run, a resume, fake CUDA."""

from __future__ import annotations

import json

import pytest
import torch

from workbench.config import RunSpec, TrainConfig
from workbench.engine import batch_size as auto_batch
from workbench.engine.batch_size import choose_batch_size, resolve_batch_size
from workbench.errors import ConfigError

GiB = 2**30


def linear(fixed_gib: float, per_row_gib: float):
    return lambda b: int((fixed_gib + b * per_row_gib) * GiB)


# ------------------------------------------------------------------ the choice
def test_largest_power_of_two_that_fits_85_percent():
    peak = linear(2, 1)  # 2 GiB fixed + 1 GiB a row
    choice = choose_batch_size(peak, 40 * GiB)  # budget 34 GiB: 32 rows need 34, 64 need 66
    assert choice.batch_size == 32 and choice.estimate_bytes == peak(32) and choice.free_bytes == 40 * GiB
    assert "batch_size auto: 32" in choice.reason and "85%" in choice.reason and "64 would need" in choice.reason
    # 85 %, not 100 %: 34 GiB free would fit 32 rows at 100 %, only 16 at 85 %
    assert choose_batch_size(peak, 34 * GiB).batch_size == 16
    assert choose_batch_size(peak, 34 * GiB, target_share=1.0).batch_size == 32


def test_cap_and_training_rows_bound_it():
    tiny = linear(0.1, 0.0001)
    assert choose_batch_size(tiny, 80 * GiB).batch_size == 512
    assert "capped at 512" in choose_batch_size(tiny, 80 * GiB).reason
    assert choose_batch_size(tiny, 80 * GiB, cap=64).batch_size == 64
    assert choose_batch_size(tiny, 80 * GiB, rows=100).batch_size == 64  # the largest power of two <= 100
    assert "100 training rows" in choose_batch_size(tiny, 80 * GiB, rows=100).reason
    # under DDP each of 4 processes loads a quarter of the rows: 25 each, so 16, not 64
    shared = choose_batch_size(tiny, 80 * GiB, rows=100, devices=4)
    assert shared.batch_size == 16 and "25 training rows per device, across 4 devices" in shared.reason


def test_nothing_fits_gives_the_minimum_and_says_so():
    choice = choose_batch_size(linear(50, 1), 40 * GiB)
    assert choice.batch_size == 1 and "even that" in choice.reason


def test_no_estimate_or_no_gpu_is_the_default():
    assert choose_batch_size(None, 40 * GiB).batch_size == 16
    assert choose_batch_size(None, 40 * GiB).source == "no-estimate"
    assert choose_batch_size(linear(1, 1), None).batch_size == 16
    assert choose_batch_size(linear(1, 1), None).source == "cpu"


# ------------------------------------------------------------------ the config
@pytest.mark.parametrize("bad", ["big", "Auto", 0, -4, 2.5, True, None])
def test_config_refuses_other_values(bad):
    with pytest.raises(ConfigError, match="batch_size") as info:
        TrainConfig(batch_size=bad)
    assert "'auto'" in str(info.value)


def test_config_accepts_auto_from_a_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  batch_size: auto\n", encoding="utf-8")
    assert RunSpec.load(path).train.batch_size == "auto"
    assert TrainConfig(batch_size=8).batch_size == 8


# ------------------------------------------------------------------ resolving for a run
def test_cpu_falls_back_to_16(monkeypatch, tiny_bert):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config, choice = resolve_batch_size(TrainConfig(batch_size="auto", task="classification"), str(tiny_bert),
                                        precision="fp32", rows=800)
    assert config.batch_size == 16 and choice.source == "cpu"
    assert choice.reason == "batch_size auto: 16 on CPU: there is no device memory to fill."
    same, none = resolve_batch_size(TrainConfig(batch_size=8), str(tiny_bert), precision="fp32", rows=800)
    assert same.batch_size == 8 and none is None


def test_fake_cuda_picks_a_larger_batch_from_the_estimate(monkeypatch, tiny_bert):
    peak = auto_batch.peak_function(str(tiny_bert), task="classification", precision="bf16", max_length=64)
    free = int(peak(64) / 0.85) + 1  # 64 rows fit 85 %, 128 do not
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (free, 2 * free))
    config, choice = resolve_batch_size(TrainConfig(batch_size="auto", task="classification", max_length=64),
                                        str(tiny_bert), precision="bf16", rows=10_000)
    assert config.batch_size == 64 and choice.estimate_bytes == peak(64) and choice.free_bytes == free
    assert "batch_size auto: 64" in choice.reason and "not the default's 16" in choice.reason
    # the peak is the estimator's own figure
    from workbench.sources.vram import estimate_vram

    assert peak(64) == int(estimate_vram(str(tiny_bert), batch_size=64, seq_len=64, precision="bf16").total_bytes)
    # a resumed run keeps its checkpoint's value, whatever the GPU has free now
    kept, again = resolve_batch_size(TrainConfig(batch_size="auto"), str(tiny_bert), precision="bf16",
                                     rows=10_000, checkpoint_record={"config": {"batch_size": 32}})
    assert kept.batch_size == 32 and again.source == "checkpoint"
    # a model without an estimate: the default
    unknown, fallback = resolve_batch_size(TrainConfig(batch_size="auto"), "/no/such/model", precision="bf16",
                                           rows=100)
    assert unknown.batch_size == 16 and fallback.source == "no-estimate"


# ------------------------------------------------------------------ a real run on CPU, and its resume
def _starts(out):
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    return [e for e in events if e["kind"] == "start"], [e for e in events if e["kind"] == "message"]


def test_fit_with_auto_on_cpu_records_its_choice_and_resumes(tmp_path, tiny_bert):
    from workbench.engine.train import fit
    from workbench.sources.synthetic import make_dataset

    data, out = make_dataset(64, 16, seed=3), tmp_path / "run"
    common = dict(output_dir=str(out), max_length=32, num_workers=0, precision="fp32", learning_rate=1e-3)
    fit(str(tiny_bert), data, batch_size=8, max_steps=2, **common)  # a run planned with 8 rows a batch
    result = fit(str(tiny_bert), data, batch_size="auto", max_steps=3, **common)  # resumed: keeps 8
    assert result.status == "completed"
    starts, messages = _starts(out)
    assert starts[-1]["resumed_from_step"] == 2 and starts[-1]["batch_size"] == 8
    assert starts[-1]["batch_size_auto"]["source"] == "checkpoint"
    assert any("not chosen again" in m["text"] for m in messages)

    fresh = tmp_path / "fresh"
    result = fit(str(tiny_bert), data, batch_size="auto", max_steps=2, **{**common, "output_dir": str(fresh)})
    assert result.status == "completed"
    starts, messages = _starts(fresh)
    assert starts[0]["batch_size"] == 16 and starts[0]["config"]["batch_size"] == 16
    assert starts[0]["batch_size_auto"]["source"] == "cpu"
    assert any(m["text"] == "batch_size auto: 16 on CPU: there is no device memory to fill." for m in messages)
    record = json.loads((fresh / "run.json").read_text())
    assert record["batch_size_auto"]["batch_size"] == 16 and record["config"]["batch_size"] == 16
