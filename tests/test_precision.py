"""The precision resolver, given device facts; bf16 autocast training on CPU."""

from __future__ import annotations

import pytest
import torch

from workbench.engine.precision import (
    DeviceFacts,
    accelerate_mixed_precision,
    resolve_precision,
    uses_scaler,
)
from workbench.errors import ConfigError

CPU = DeviceFacts(cuda=False, bf16=False)
AMPERE = DeviceFacts(cuda=True, bf16=True, name="NVIDIA A100")
TURING = DeviceFacts(cuda=True, bf16=False, name="Tesla T4")


@pytest.mark.parametrize(
    ("requested", "facts", "expected"),
    [
        ("auto", CPU, "fp32"),
        ("auto", AMPERE, "bf16"),
        ("auto", TURING, "fp16"),
        ("fp32", AMPERE, "fp32"),
        ("fp16", TURING, "fp16"),
        ("fp16", AMPERE, "fp16"),
        ("bf16", AMPERE, "bf16"),
        ("bf16", CPU, "bf16"),  # CPU autocast supports bf16
    ],
)
def test_resolution(requested, facts, expected):
    assert resolve_precision(requested, facts) == expected


def test_fp16_on_cpu_is_a_config_error_with_a_fix():
    with pytest.raises(ConfigError, match="fp16") as info:
        resolve_precision("fp16", CPU)
    assert "bf16" in info.value.fix


def test_bf16_on_pre_ampere_gpu_is_refused():
    with pytest.raises(ConfigError, match="Tesla T4"):
        resolve_precision("bf16", TURING)


def test_accelerate_names_and_scaler():
    assert [accelerate_mixed_precision(p) for p in ("fp32", "fp16", "bf16")] == ["no", "fp16", "bf16"]
    assert uses_scaler("fp16") and not uses_scaler("bf16") and not uses_scaler("fp32")


def test_bf16_trains_on_cpu(tiny_bert, tmp_path):
    from workbench.frontend import fit
    from workbench.sources.synthetic import make_dataset

    torch.set_num_threads(2)
    result = fit(str(tiny_bert), make_dataset(64, 32), output_dir=str(tmp_path / "run"), precision="bf16",
                 max_steps=4, batch_size=8, learning_rate=2e-3, num_workers=0, progress="none")
    assert result.status == "completed"
    start = next(e for e in result.history if e["kind"] == "start")
    assert start["precision"] == "bf16"
    assert all(torch.isfinite(torch.tensor(e["loss"])) for e in result.history if e["kind"] == "train")


def test_fp16_fit_on_cpu_fails_before_training(tiny_bert, tmp_path):
    from workbench.frontend import fit
    from workbench.sources.synthetic import make_dataset

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: fp16 is valid here (see tests/gpu)")
    with pytest.raises(ConfigError, match="precision"):
        fit(str(tiny_bert), make_dataset(16, 8), output_dir=str(tmp_path / "run"), precision="fp16",
            progress="none")
    assert not (tmp_path / "run").exists()
