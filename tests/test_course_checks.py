"""The course's check cells: a correct answer passes, each classic mistake gets its own hint.

The broken answers below are the mistakes students really make in the four-step
loop; every test asserts the specific hint, so a check that says only "wrong"
(or passes everything) fails here.
"""

from __future__ import annotations

import pytest
import torch

from workbench.course import checks as course_checks


def _correct(model, batch, optimizer, scaler):
    optimizer.zero_grad()
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=False):
        loss = model(**batch).loss
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.item()


def _zero_grad_at_end(model, batch, optimizer, scaler):
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    model.zero_grad(set_to_none=True)  # another correct place for it
    return loss.item()


def _no_backward(model, batch, optimizer, scaler):
    optimizer.zero_grad()
    loss = model(**batch).loss
    optimizer.step()
    return loss.item()


def _no_step(model, batch, optimizer, scaler):
    optimizer.zero_grad()
    loss = model(**batch).loss
    loss.backward()
    return loss.item()


def _no_zero_grad(model, batch, optimizer, scaler):
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    return loss.item()


def _zero_grad_before_step(model, batch, optimizer, scaler):
    loss = model(**batch).loss
    loss.backward()
    optimizer.zero_grad()
    optimizer.step()
    return loss.item()


def _returns_nothing(model, batch, optimizer, scaler):
    optimizer.zero_grad()
    model(**batch).loss.backward()
    optimizer.step()


def _item_before_backward(model, batch, optimizer, scaler):
    optimizer.zero_grad()
    loss = torch.tensor(model(**batch).loss.item())
    loss.backward()
    optimizer.step()
    return loss.item()


def _bf16_autocast(model, batch, optimizer, scaler):
    optimizer.zero_grad()
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    return loss.item()


def _check(fn, **kwargs):
    return course_checks.check_train_step(fn, quiet=True, **kwargs)


@pytest.mark.parametrize("fn", [_correct, _zero_grad_at_end])
def test_correct_train_steps_pass(fn):
    result = _check(fn)
    assert result.passed, result.message
    assert "loss goes down" in result.message


def test_growing_gradients_of_a_correct_loop_are_not_blamed_on_zero_grad():
    # At a high learning rate the gradient norm grows by itself; the check compares each
    # applied gradient with a fresh one, so only really accumulated gradients are reported.
    result = _check(_correct, lr=0.5)
    assert result.passed, result.message


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (_no_backward, "did you call loss.backward()"),
        (_no_step, "did you call optimizer.step()"),
        (_no_zero_grad, "did you call optimizer.zero_grad()"),
        (_zero_grad_before_step, "before loss.backward(), not between backward() and step()"),
        (_returns_nothing, "return loss.item()"),
        (_item_before_backward, "do not call .item() before backward()"),
        (None, "still None"),
    ],
)
def test_each_mistake_gets_its_own_hint(fn, hint):
    result = _check(fn)
    assert not result.passed
    assert hint in result.message


def test_missing_autocast_is_reported_when_the_notebook_asks_for_bf16():
    result = _check(_no_zero_grad_free_fp32, amp_dtype=torch.bfloat16)
    assert not result.passed
    assert "ran in full precision" in result.message
    assert _check(_bf16_autocast, amp_dtype=torch.bfloat16).passed


def _no_zero_grad_free_fp32(model, batch, optimizer, scaler):
    optimizer.zero_grad()
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    return loss.item()


def test_check_prints_a_marked_verdict(capsys):
    course_checks.check_train_step(_no_step)
    out = capsys.readouterr().out
    assert out.startswith(course_checks.FAIL_MARK)
    assert "optimizer.step()" in out


def test_probabilities_check_names_the_mistake():
    assert course_checks.check_probabilities(lambda x: torch.softmax(x, dim=-1), quiet=True)
    wrong_dim = course_checks.check_probabilities(lambda x: torch.softmax(x, dim=0), quiet=True)
    assert "dim=-1" in wrong_dim.message and not wrong_dim.passed
    sigmoid = course_checks.check_probabilities(torch.sigmoid, quiet=True)
    assert "sigmoid" in sigmoid.message and not sigmoid.passed
    raw = course_checks.check_probabilities(lambda x: x, quiet=True)
    assert "sum to 1" in raw.message and not raw.passed


def test_tokenized_batch_check(tiny_bert):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    texts = ["The film is great.", "The plot is really dull, the cast is bland."]
    good = tokenizer(texts, padding=True, truncation=True, max_length=32, return_tensors="pt")
    assert course_checks.check_tokenized_batch(good, texts, tokenizer, 32, quiet=True).passed

    as_lists = tokenizer(texts, truncation=True, max_length=32)
    assert "padding=True" in course_checks.check_tokenized_batch(
        as_lists, texts, tokenizer, 32, quiet=True).message
    padded_lists = tokenizer(texts, padding=True, truncation=True, max_length=32)
    assert "return_tensors" in course_checks.check_tokenized_batch(
        padded_lists, texts, tokenizer, 32, quiet=True).message
    too_long = tokenizer(texts, padding=True, return_tensors="pt")
    assert "truncation=True" in course_checks.check_tokenized_batch(
        too_long, texts, tokenizer, 4, quiet=True).message
    bad_mask = dict(good)
    bad_mask["attention_mask"] = torch.ones_like(good["attention_mask"])
    assert "attention mask" in course_checks.check_tokenized_batch(
        bad_mask, texts, tokenizer, 32, quiet=True).message


def test_fp16_scaler_must_take_part_in_every_step():
    # The CPU GradScaler stands in for the CUDA one: same API, same bookkeeping.
    assert _check(_correct, use_scaler=True).passed
    result = _check(_no_zero_grad_free_fp32, use_scaler=True)
    assert not result.passed
    assert "scaler.scale(...) was not called" in result.message
