"""workbench.tasks.causal_lm_packing: packed batches give the padded path's loss, gradients and
eval outputs; the choice of "auto"; refusals where packing cannot keep conversations apart.

The padded batch is the reference. Every comparison runs the tiny Llama (tests/llm_fixtures.py) in
fp32 on the same rows laid out both ways.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from workbench.config import TrainConfig
from workbench.errors import ConfigError
from workbench.sources.synthetic_llm import make_chat_dataset
from workbench.tasks import causal_lm_packing as packing
from workbench.tasks.causal_lm import CausalLMTask
from workbench.tasks.causal_lm_data import IGNORE


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama_dir)


@pytest.fixture(scope="module")
def lora_model(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    from workbench.tasks import lora

    torch.manual_seed(0)
    model = lora.wrap(AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32), r=4, alpha=8,
                      dropout=0.0, targets=None)
    for name, p in model.named_parameters():  # B starts at zero: make the adapters matter
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)
    return model


def _tasks_and_rows(tokenizer, model, n=6):
    data = make_chat_dataset(n, 4)
    tasks = {}
    for name, setting in (("padded", False), ("packed", True)):
        task = CausalLMTask(TrainConfig(task="causal_lm", packing=setting))
        task.check_data(data)
        train, _ = task.datasets(data, tokenizer, 512, model)
        tasks[name] = task
    rows = [train[i] for i in range(len(train))]
    return tasks, rows


def _loss_and_grads(task, model, batch):
    model.zero_grad()
    loss = task.loss(model, batch)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return loss.item(), grads


# ----------------------------------------------------------------- the same numbers
def test_packed_batch_gives_the_padded_loss_and_gradients(tokenizer, lora_model):
    tasks, rows = _tasks_and_rows(tokenizer, lora_model)
    padded = tasks["padded"].collator(tokenizer)(rows)
    packed = tasks["packed"].collator(tokenizer)(rows)
    assert padded["attention_mask"].min() == 0 and "attention_mask" not in packed  # both layouts, for real
    assert packed["input_ids"].shape == (1, sum(len(r["input_ids"]) for r in rows))
    assert int((packed["position_ids"] == 0).sum()) == len(rows) == tasks["packed"].rows(packed)
    assert tasks["packed"].units(packed) == tasks["padded"].units(padded)  # accumulation weights agree
    loss_padded, grads_padded = _loss_and_grads(tasks["padded"], lora_model, padded)
    loss_packed, grads_packed = _loss_and_grads(tasks["packed"], lora_model, packed)
    assert abs(loss_packed - loss_padded) < 1e-5, (loss_packed, loss_padded)
    assert grads_padded.keys() == grads_packed.keys() and grads_padded
    for name in grads_padded:
        torch.testing.assert_close(grads_packed[name], grads_padded[name], atol=1e-6, rtol=1e-4)


def test_packing_keeps_conversations_apart(tokenizer, lora_model):
    """The same row with positions that do not restart (one long sequence) gives another loss: the
    equality above comes from the block-diagonal mask, not from attention being indifferent."""
    tasks, rows = _tasks_and_rows(tokenizer, lora_model)
    packed = tasks["packed"].collator(tokenizer)(rows)
    joined = {**packed, "position_ids": torch.arange(packed["input_ids"].shape[1])[None]}
    with torch.no_grad():
        apart, together = tasks["packed"].loss(lora_model, packed), tasks["packed"].loss(lora_model, joined)
    assert abs(apart.item() - together.item()) > 1e-3


def test_no_token_predicts_across_a_boundary(tokenizer, lora_model):
    tasks, rows = _tasks_and_rows(tokenizer, lora_model)
    packed = tasks["packed"].collator(tokenizer)(rows)
    starts = (packed["position_ids"][0] == 0).nonzero()[:, 0]
    assert (packed["labels"][0, starts] == IGNORE).all()


def test_eval_outputs_are_per_example_and_equal_packed_or_padded(tokenizer, lora_model):
    tasks, rows = _tasks_and_rows(tokenizer, lora_model)
    with torch.no_grad():
        padded = tasks["padded"].eval_outputs(lora_model, tasks["padded"].collator(tokenizer)(rows))
        packed = tasks["packed"].eval_outputs(lora_model, tasks["packed"].collator(tokenizer)(rows))
    for a, b in zip(padded, packed, strict=True):
        assert a.shape == b.shape == (len(rows),)
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-5)
    # relative: the perplexity of random weights is ~5e4, where float rounding alone moves it by ~0.01
    assert tasks["packed"].metrics([packed]) == pytest.approx(tasks["padded"].metrics([padded]), rel=1e-5)


def test_micro_batches_of_a_packed_batch_weigh_like_the_whole(tokenizer, lora_model):
    """After an out-of-memory a packed batch is cut at conversation boundaries; weighted by units,
    the pieces' losses add up to the whole batch's, as on the padded path."""
    tasks, rows = _tasks_and_rows(tokenizer, lora_model)
    task = tasks["packed"]
    batch = task.collator(tokenizer)(rows)
    pieces = task.split(batch, 2)
    assert len(pieces) == 3 and all(task.rows(p) == 2 for p in pieces)
    total = sum(task.units(p) for p in pieces)
    with torch.no_grad():
        weighted = sum(task.loss(lora_model, p) * task.units(p) / total for p in pieces)
        whole = task.loss(lora_model, batch)
    assert abs(weighted.item() - whole.item()) < 1e-5


def test_packing_with_the_cpu_bf16_attention_keeps_conversations_apart(tokenizer, tiny_llama_dir):
    """engine/cpu_bf16.py renames the attention; transformers builds no mask for a name it does not
    know, so the name carries sdpa's mask builder and the packed loss still equals the padded one."""
    from transformers import AutoModelForCausalLM

    from workbench.engine.cpu_bf16 import ATTENTION, attention_in_fp32

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
    assert attention_in_fp32(model) and model.config._attn_implementation == ATTENTION
    tasks, rows = _tasks_and_rows(tokenizer, model)
    assert tasks["packed"].padding_free
    with torch.no_grad():
        padded = tasks["padded"].loss(model, tasks["padded"].collator(tokenizer)(rows))
        packed = tasks["packed"].loss(model, tasks["packed"].collator(tokenizer)(rows))
    assert abs(packed.item() - padded.item()) < 1e-5


# ------------------------------------------------------------------------ the choice
def _choose(setting="auto", attn="sdpa", cuda=False, lengths=(10,) * 64, batch_size=8, grouped=True):
    return packing.choose_packing(setting, attn_implementation=attn, cuda=cuda, lengths=list(lengths),
                                  batch_size=batch_size, group_by_length=grouped)


def test_auto_packs_where_padding_would_cost_more_than_the_mask():
    mixed = [20 + (i * 37) % 180 for i in range(256)]  # 20..200 tokens, as in the measurement
    assert packing.padding_share(mixed, 8, group_by_length=False) > packing.PAYS_AT_PADDING
    assert packing.padding_share(mixed, 8, group_by_length=True) < packing.PAYS_AT_PADDING
    assert _choose(lengths=mixed, grouped=False).on
    off = _choose(lengths=mixed, grouped=True)  # the default length grouping leaves little padding
    assert not off.on and "padding" in off.reason
    assert not _choose(lengths=[50] * 64, grouped=False).on  # equal lengths: nothing to remove
    assert not _choose(setting=False, lengths=mixed, grouped=False).on
    assert _choose(setting=True, lengths=[50] * 64).on


def test_auto_packs_with_flash_attention_on_cuda_only():
    on = _choose(attn="flash_attention_2", cuda=True)
    assert on.on and on.flash
    assert not _choose(attn="flash_attention_2", cuda=False).on
    with pytest.raises(ConfigError, match="packing"):
        _choose(setting=True, attn="flash_attention_2", cuda=False)


def test_forced_packing_is_refused_where_attention_would_cross_conversations():
    with pytest.raises(ConfigError) as info:
        _choose(setting=True, attn="paged|some_kernel")
    assert info.value.field == "packing" and "packing: auto" in str(info.value)
    assert not _choose(attn="paged|some_kernel").on
    assert not _choose(attn=None).on  # unknown: padded


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_packing_setting_values(value):
    with pytest.raises(ConfigError, match="packing"):
        TrainConfig(task="causal_lm", packing=value)


def test_packing_is_refused_for_other_tasks():
    with pytest.raises(ConfigError, match="causal_lm"):
        TrainConfig(task="classification", packing=True)
    assert dataclasses.replace(TrainConfig(task="classification"), packing=False).packing is False
