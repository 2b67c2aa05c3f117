"""The course's train_step check on a real GPU: fp16 with the GradScaler, and bf16."""

from __future__ import annotations

import pytest
import torch

from workbench.course import checks as course_checks

pytestmark = pytest.mark.gpu


def _make_step(dtype):
    def train_step(model, batch, optimizer, scaler):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=dtype):
            loss = model(**batch).loss
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss.item()

    return train_step


def _without_scaler(model, batch, optimizer, scaler):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type="cuda", dtype=torch.float16):
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    return loss.item()


def test_fp16_step_with_scaler_passes_on_cuda():
    result = course_checks.check_train_step(_make_step(torch.float16), device="cuda",
                                            amp_dtype=torch.float16, use_scaler=True, quiet=True)
    assert result.passed, result.message


def test_fp16_step_without_scaler_is_reported():
    result = course_checks.check_train_step(_without_scaler, device="cuda",
                                            amp_dtype=torch.float16, use_scaler=True, quiet=True)
    assert not result.passed
    assert "GradScaler" in result.message


def test_bf16_step_passes_where_supported():
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("bf16 needs compute capability 8.0 or newer")
    result = course_checks.check_train_step(_make_step(torch.bfloat16), device="cuda",
                                            amp_dtype=torch.bfloat16, quiet=True)
    assert result.passed, result.message
