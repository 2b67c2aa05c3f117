"""workbench.tasks.causal_lm_loss: when the loss goes through liger-kernel's fused linear
cross-entropy, and that routing it there gives the sparse LM head's loss and gradients.

No CUDA here: ``fused_linear_ce`` (the one seam to liger) is replaced by plain torch, so the
test checks everything around the kernel: the hidden states at the loss positions, the head's
weight (tied to the embeddings in the tiny Llama), the targets and the mean's reduction.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from workbench.config import TrainConfig
from workbench.errors import ConfigError
from workbench.sources.synthetic_llm import make_chat_dataset
from workbench.tasks import causal_lm_loss as fused
from workbench.tasks.causal_lm import CausalLMTask


# ------------------------------------------------------------------ the choice
def test_cpu_keeps_the_sparse_head_and_says_why():
    choice = fused.choose_loss("auto", cuda=False, liger=True, head_issue=None)
    assert not choice.fused and "CUDA" in choice.reason


def test_cuda_with_liger_fuses():
    choice = fused.choose_loss("auto", cuda=True, liger=True, head_issue=None)
    assert choice.fused and "liger" in choice.reason
    assert fused.choose_loss(True, cuda=True, liger=True, head_issue=None).fused


def test_cuda_without_liger_names_the_install():
    choice = fused.choose_loss("auto", cuda=True, liger=False, head_issue=None)
    assert not choice.fused and "pip install liger-kernel" in choice.reason


def test_unsupported_head_or_fsdp_keeps_the_sparse_head():
    assert not fused.choose_loss("auto", cuda=True, liger=True, head_issue="its LM head has a bias").fused
    assert not fused.choose_loss("auto", cuda=True, liger=True, head_issue=None, distributed="fsdp").fused


def test_forced_where_it_cannot_run_is_refused():
    with pytest.raises(ConfigError, match="CUDA"):
        fused.choose_loss(True, cuda=False, liger=False, head_issue=None)
    with pytest.raises(ConfigError, match="pip install liger-kernel"):
        fused.choose_loss(True, cuda=True, liger=False, head_issue=None)


def test_false_never_fuses():
    assert not fused.choose_loss(False, cuda=True, liger=True, head_issue=None).fused


def test_config_checks_the_switch():
    assert TrainConfig(task="causal_lm").fused_loss == "auto"
    with pytest.raises(ConfigError, match="fused_loss"):
        TrainConfig(task="causal_lm", fused_loss="yes")
    with pytest.raises(ConfigError, match="fused_loss"):
        TrainConfig(task="classification", fused_loss=True)


def test_head_problem(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
    assert fused.head_problem(model) is None  # tied, no bias
    model.config.final_logit_softcapping = 30.0
    assert "softcapping" in fused.head_problem(model)


def test_task_on_cuda_with_liger_chooses_fused(tiny_llama_dir, monkeypatch):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fused, "liger_available", lambda: True)
    task = CausalLMTask(TrainConfig(task="causal_lm"))
    assert task.choose_loss(model).fused and any("liger" in text for text, _ in task.notes)
    monkeypatch.setattr(fused, "liger_available", lambda: False)
    task = CausalLMTask(TrainConfig(task="causal_lm"))
    assert not task.choose_loss(model).fused
    assert any("pip install liger-kernel" in text for text, _ in task.notes)
    with pytest.raises(ConfigError, match="pip install liger-kernel"):
        CausalLMTask(TrainConfig(task="causal_lm", fused_loss=True)).choose_loss(model)


# ------------------------------------------------------------ the same numbers
def _torch_linear_ce(hidden, weight, labels):  # the test double of liger's kernel
    return F.cross_entropy((hidden @ weight.T).float(), labels, ignore_index=-100, reduction="mean")


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama_dir)


def _loss_and_grads(task, model, batch):
    model.zero_grad()
    loss = task.loss(model, batch)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return loss.item(), grads


@pytest.mark.parametrize("finetune", ["full", "lora"])
@pytest.mark.parametrize("packed", [False, True])
def test_fused_routing_gives_the_sparse_head_loss_and_gradients(tiny_llama_dir, tokenizer, monkeypatch,
                                                                 packed, finetune):
    from transformers import AutoModelForCausalLM

    from workbench.tasks import lora

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
    if finetune == "lora":
        model = lora.wrap(model, r=4, alpha=8, dropout=0.0, targets=None)
        for name, p in model.named_parameters():  # B starts at zero: make the adapters matter
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.05)
    data = make_chat_dataset(6, 4)
    task = CausalLMTask(TrainConfig(task="causal_lm", packing=packed, fused_loss=False))
    task.check_data(data)
    train, _ = task.datasets(data, tokenizer, 512, model)
    batch = task.collator(tokenizer)([train[i] for i in range(len(train))])

    calls = []
    monkeypatch.setattr(fused, "fused_linear_ce", lambda *a: calls.append(a) or _torch_linear_ce(*a))
    sparse_loss, sparse_grads = _loss_and_grads(task, model, batch)
    assert not calls
    task.loss_path = fused.LossChoice(True, "test")
    fused_loss, fused_grads = _loss_and_grads(task, model, batch)
    hidden, weight, labels = calls[0]
    assert hidden.shape == (int(task.units(batch)), model.config.hidden_size)  # only the loss positions
    assert weight is model.get_output_embeddings().weight and labels.shape == hidden.shape[:1]
    assert type(model.get_output_embeddings()).forward is torch.nn.Linear.forward  # the head is back
    assert "forward" not in vars(model.get_output_embeddings())

    assert abs(fused_loss - sparse_loss) < 1e-5, (fused_loss, sparse_loss)
    assert sparse_grads.keys() == fused_grads.keys() and sparse_grads
    for name in sparse_grads:
        torch.testing.assert_close(fused_grads[name], sparse_grads[name], atol=1e-6, rtol=1e-4)
