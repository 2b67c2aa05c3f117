"""The CPU time estimate (workbench.sources.cpu_time) and the model picker's time per epoch.

The rate is injected (``rate=``) so the arithmetic is checked exactly; how close the estimate
comes to a real run is printed by benchmarks/cpu_bf16.py (timings belong there, not in tests).
"""

from __future__ import annotations

import shutil

import pytest

from workbench.engine.precision import DeviceFacts
from workbench.errors import ConfigError
from workbench.sources import cpu_time
from workbench.sources.models import model_info
from workbench.sources.synthetic import write_csv

NATIVE = DeviceFacts(cuda=False, bf16=True, evidence="AVX512-BF16")
EMULATED = DeviceFacts(cuda=False, bf16=False, evidence="no AVX512-BF16 or AMX-BF16")
GFLOPS = {False: 190e9, True: 400e9}  # fp32 / bf16 matmul rates of 2 AMD EPYC cores


def rate(bf16: bool) -> float:
    return GFLOPS[bf16]


@pytest.fixture(scope="module")
def info(tiny_bert):
    return model_info(str(tiny_bert))


def test_work_per_row_counts_matmul_weights_and_attention(info):
    weights = info.num_parameters - info.vocab_size * info.hidden_size
    attention = 12 * info.num_layers * 64 * info.hidden_size
    assert cpu_time.flops_per_row(info, 64) == (6 * weights + attention) * 64
    assert cpu_time.flops_per_row(info, 64, "lora") == (4 * weights + attention) * 64  # no weight gradients


@pytest.mark.parametrize(("facts", "ran"), [(NATIVE, "bf16"), (EMULATED, "fp32")])
def test_auto_is_timed_in_the_precision_a_run_would_use(info, facts, ran):
    est = cpu_time.estimate_cpu_time(info, seq_len=64, rows=5000, facts=facts, rate=rate)
    work = cpu_time.flops_per_row(info, 64)
    assert est.precision == ran and est.reason.startswith(f"auto: {ran}")
    assert est.fp32_seconds_per_row == pytest.approx(work / (190e9 * cpu_time.EFFICIENCY))
    expected = work / (GFLOPS[ran == "bf16"] * cpu_time.EFFICIENCY)
    assert est.seconds_per_row == pytest.approx(expected)
    assert est.epoch_seconds == pytest.approx(5000 * expected)
    text = est.describe()
    assert f"On this CPU in {ran}" in text and "per epoch of 5,000 rows" in text
    assert ("fp32 would take" in text) is (ran == "bf16")


def test_explicit_precision_and_text_length(info):
    fp32 = cpu_time.estimate_cpu_time(info, seq_len=128, precision="fp32", facts=NATIVE, rate=rate)
    assert fp32.precision == "fp32" and "per 1,000 training rows of up to 128 tokens" in fp32.describe()
    short = cpu_time.estimate_cpu_time(info, seq_len=128, row_tokens=20, facts=NATIVE, rate=rate)
    assert short.flops_per_row == cpu_time.flops_per_row(info, 20) and "about 20 tokens" in short.describe()
    assert cpu_time.tokens_from_chars(68.0, 128) == 20 and cpu_time.tokens_from_chars(0.0, 128) == 128
    assert cpu_time.tokens_from_chars(10_000.0, 128) == 128  # never past max_length
    with pytest.raises(ConfigError, match="fp16"):
        cpu_time.estimate_cpu_time(info, seq_len=64, precision="fp16", facts=NATIVE, rate=rate)


# ---------------------------------------------------------------- the picker
@pytest.fixture()
def models_dir(tiny_bert, tmp_path, monkeypatch):
    root = tmp_path / "models"
    shutil.copytree(tiny_bert, root / "tiny-bert")
    monkeypatch.setenv("WORKBENCH_MODELS", str(root))
    return root


def test_picker_shows_time_per_epoch_on_cpu_from_the_chosen_data(models_dir, tmp_path, monkeypatch):
    from workbench.sources import vram
    from workbench.widgets.pickers import pickers

    monkeypatch.setattr(vram, "_free_memory", lambda *args: (None, None, None))  # no GPU here
    monkeypatch.setattr(cpu_time, "cpu_rate", rate)
    write_csv(tmp_path / "data" / "train.csv", 100)
    both = pickers()
    both.model.select(str(models_dir / "tiny-bert"))
    assert "per 1,000 training rows" in both.model.estimate.value  # no data yet
    both.dataset.path = str(tmp_path / "data")
    assert both.dataset.load()
    assert both.model.train_rows == 90  # a 10% validation share split off train
    assert both.model.text_chars == pytest.approx(both.dataset.text_chars) and both.model.text_chars > 20
    assert both.model.cpu_time.rows == 90 and "per epoch of 90 rows" in both.model.estimate.value
    assert both.dataset.check()
    assert both.model.train_rows == both.dataset.checked["train"].num_rows  # exact after the check


def test_picker_with_a_gpu_shows_no_cpu_time(models_dir):
    from workbench.widgets.pickers import ModelPicker

    picker = ModelPicker(free_bytes=8 * 2**30)  # a GPU with 8 GiB free
    picker.select(str(models_dir / "tiny-bert"))
    assert picker.cpu_time is None and "On this CPU" not in picker.estimate.value
