"""LoRA through the causal-LM task: a real SmolLM2 learns, only adapters change, saving and merging."""

from __future__ import annotations

import copy
import os

import pytest
import torch

from workbench.config import ModelChoice, TrainConfig
from workbench.engine.batching import LengthGroupedBatchSampler
from workbench.errors import ConfigError
from workbench.sources.synthetic_llm import make_chat_dataset
from workbench.tasks import lora
from workbench.tasks.causal_lm import CausalLMTask

LLAMA_PROJECTIONS = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]


def _eval_loss(task, model, dataset, collate):
    model.eval()
    with torch.no_grad():
        outputs = [task.eval_outputs(model, collate([dataset[i] for i in range(s, min(s + 8, len(dataset)))]))
                   for s in range(0, len(dataset), 8)]
    return task.metrics(outputs)["eval_loss"]


def _probe(task, tokenizer, dataset):
    return task.collator(tokenizer)([dataset[i] for i in range(4)])


def _train(task, choice, data, *, steps: int, batch_size: int, lr: float):
    """A plain loop: length-grouped batches, AdamW on the trainable weights only."""
    torch.manual_seed(0)
    task.check_data(data)
    tokenizer = task.load_tokenizer(choice)
    model = task.build_model(choice, tokenizer, TrainConfig())
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    train, evaluation = task.datasets(data, tokenizer, 256, model)
    collate = task.collator(tokenizer)
    before = _eval_loss(task, model, evaluation, collate)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    sampler = LengthGroupedBatchSampler(train.lengths, batch_size, seed=0)
    done, epoch = 0, 0
    model.train()
    while done < steps:
        sampler.set_epoch(epoch)
        for indices in list(sampler)[:steps - done]:
            task.loss(model, collate([train[i] for i in indices])).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done += 1
        epoch += 1
    after = _eval_loss(task, model, evaluation, collate)
    return dict(task=task, model=model, tokenizer=tokenizer, frozen=frozen, before=before, after=after,
                evaluation=evaluation, choice=choice)


@pytest.fixture(scope="module")
def trained(tiny_llama_dir):
    """The tiny Llama with LoRA r=8 on every projection, 20 steps: the mechanics, in seconds."""
    task = CausalLMTask(lora_r=8, lora_alpha=16, lora_dropout=0.0)
    return _train(task, ModelChoice(str(tiny_llama_dir)), make_chat_dataset(80, 16),
                  steps=20, batch_size=8, lr=1e-2)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("CI") == "true",
                    reason="minutes of real SmolLM2 LoRA steps on 2 cores; run it with `pytest -m slow tests/test_lora.py`")
def test_lora_on_real_smollm2_lowers_eval_loss(smollm2_dir):
    # The real model, because only a pretrained model shows LoRA doing its job on top of
    # what it knows. 3 steps of batch 4: each costs 5-40 s on the shared 2-core CPU.
    task = CausalLMTask(lora_r=8, lora_alpha=16, lora_dropout=0.0)
    run = _train(task, ModelChoice(str(smollm2_dir)), make_chat_dataset(12, 8),
                 steps=3, batch_size=4, lr=2e-3)
    assert run["after"] < 0.8 * run["before"], (run["before"], run["after"])
    assert task.identity()["lora"]["target_modules"] == LLAMA_PROJECTIONS
    changed = [n for n, p in run["model"].named_parameters()
               if not p.requires_grad and not torch.equal(p, run["frozen"][n])]
    assert changed == []


def test_lora_lowers_eval_loss_and_leaves_the_base_untouched(trained):
    # A random 64-wide model moves slowly (10.8 -> 10.1 nats); the real model's test checks the size.
    assert trained["after"] < trained["before"] - 0.5, (trained["before"], trained["after"])
    model = trained["model"]
    changed = [n for n, p in model.named_parameters() if not p.requires_grad
               and not torch.equal(p, trained["frozen"][n])]
    assert changed == []  # bit-equal, not merely close
    assert all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    facts = trained["task"].identity()
    assert facts["lora"]["target_modules"] == LLAMA_PROJECTIONS  # found from the model, head excluded
    assert facts["parameters"]["trainable"] < 0.1 * facts["parameters"]["total"]


def test_checkpoint_state_is_the_adapter_only_and_restores_it(trained):
    task, model = trained["task"], trained["model"]
    state = task.model_state(model)
    adapter_bytes = sum(t.numel() * t.element_size() for t in state.values())
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert all("lora_" in k for k in state)
    # Tiny Llama: 133 k adapter weights vs 3.3 M (mostly the 49k x 64 embedding); SmolLM2: ~1.8 %.
    assert adapter_bytes < 0.1 * model_bytes, (adapter_bytes, model_bytes)

    fresh = task.build_model(trained["choice"], trained["tokenizer"], TrainConfig())
    batch = _probe(task, trained["tokenizer"], trained["evaluation"])
    model.eval()
    fresh.eval()
    with torch.no_grad():
        assert not torch.allclose(fresh(**batch).logits, model(**batch).logits, atol=1e-3)
        task.load_model_state(fresh, state)
        torch.testing.assert_close(fresh(**batch).logits, model(**batch).logits, atol=1e-5, rtol=0)


def test_adapter_folder_and_merged_model_load_and_agree(trained, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, pipeline

    task, model, tokenizer = trained["task"], trained["model"], trained["tokenizer"]
    batch = _probe(task, tokenizer, trained["evaluation"])
    model.eval()
    with torch.no_grad():
        expected = model(**batch).logits

    adapter_dir = task.save_model(model, tokenizer, tmp_path / "adapter")
    assert sorted(p.name for p in adapter_dir.iterdir() if p.name.startswith("adapter_")) == \
        ["adapter_config.json", "adapter_model.safetensors"]
    assert (adapter_dir / "adapter_model.safetensors").stat().st_size < 2 * 2**20
    base = AutoModelForCausalLM.from_pretrained(trained["choice"].name_or_path)
    reloaded = PeftModel.from_pretrained(base, adapter_dir).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch).logits, expected, atol=1e-5, rtol=0)
    del base, reloaded

    merged_dir = task.merge_and_save(model, tokenizer, tmp_path / "merged")
    assert not (merged_dir / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    with torch.no_grad():
        torch.testing.assert_close(merged(**batch).logits, expected, atol=1e-4, rtol=0)
    del merged
    generator = pipeline("text-generation", model=str(merged_dir))
    prompt = tokenizer.decode(trained["evaluation"][0]["input_ids"][:-4])  # up to the answer
    out = generator(prompt, max_new_tokens=8, do_sample=False, return_full_text=False)
    assert isinstance(out[0]["generated_text"], str) and out[0]["generated_text"].strip()


# ------------------------------------------------------------------ tiny model, fast
def test_qlora_without_cuda_is_refused_with_lora_suggested(tiny_llama_dir, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    task = CausalLMTask(finetune="qlora")
    choice = ModelChoice(str(tiny_llama_dir))
    with pytest.raises(ConfigError) as err:
        task.build_model(choice, task.load_tokenizer(choice), TrainConfig())
    assert err.value.field == "finetune" and "finetune='lora'" in err.value.fix
    assert "NVIDIA GPU" in err.value.fix


def test_targets_are_found_from_the_model_and_checked(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    assert lora.linear_target_names(model) == LLAMA_PROJECTIONS
    with pytest.raises(ConfigError, match="q_proj") as err:
        lora.wrap(model, r=4, alpha=8, dropout=0.0, targets=["query", "q_proj"])
    assert err.value.field == "lora_target_modules" and err.value.value == ["query"]
    wrapped = lora.wrap(model, r=4, alpha=8, dropout=0.0, targets=["q_proj", "v_proj"])
    adapted = {n.split(".")[-4] for n, _ in wrapped.named_parameters() if "lora_A" in n}
    assert adapted == {"q_proj", "v_proj"}


def test_no_dropout_op_at_lora_dropout_zero(tiny_llama_dir):
    """At 0 peft puts an Identity where the dropout goes: no mask drawn, no op per adapter per step
    (2 layers x 7 adapters here, 210 in SmolLM2-135M); at 0.05 each adapter has its Dropout."""
    from torch import nn
    from transformers import AutoModelForCausalLM

    def dropouts(p):
        model = lora.wrap(AutoModelForCausalLM.from_pretrained(tiny_llama_dir), r=4, alpha=8, dropout=p, targets=None)
        return [m for n, m in model.named_modules() if "lora_dropout" in n and isinstance(m, nn.Dropout)]

    assert dropouts(0.0) == []
    assert len(dropouts(0.05)) == 2 * len(LLAMA_PROJECTIONS)


def test_gradient_checkpointing_still_trains_the_adapters(tiny_llama_dir):
    choice = ModelChoice(str(tiny_llama_dir))
    task = CausalLMTask(lora_r=4, lora_alpha=8, lora_dropout=0.0)
    data = make_chat_dataset(8, 4)
    task.check_data(data)
    tokenizer = task.load_tokenizer(choice)
    model = task.build_model(choice, tokenizer, TrainConfig(gradient_checkpointing=True))
    assert model.base_model.model.model.gradient_checkpointing
    train, _ = task.datasets(data, tokenizer, 256, model)
    model.train()
    task.loss(model, task.collator(tokenizer)([train[i] for i in range(4)])).backward()
    # lora_B starts at zero, so the first gradient reaches B only (A's is B^T times something).
    grads = [p.grad for n, p in model.named_parameters() if "lora_B" in n]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)


def test_full_finetuning_trains_and_saves_every_weight(tiny_llama_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    choice = ModelChoice(str(tiny_llama_dir))
    task = CausalLMTask(finetune="full")
    data = make_chat_dataset(8, 4)
    task.check_data(data)
    tokenizer = task.load_tokenizer(choice)
    model = task.build_model(choice, tokenizer, TrainConfig())
    assert all(p.requires_grad and p.dtype == torch.float32 for p in model.parameters())
    assert "lora" not in task.identity()
    task.save_model(model, tokenizer, tmp_path / "model")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    for (name, a), b in zip(model.state_dict().items(), reloaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_adapter_state_and_optimizer_state_resume_exactly(tiny_llama_dir):
    # What the engine's checkpoint will hold for LoRA: model_state (adapter only) + AdamW state.
    choice = ModelChoice(str(tiny_llama_dir))
    task = CausalLMTask(lora_r=4, lora_alpha=8, lora_dropout=0.0)
    data = make_chat_dataset(16, 4)
    task.check_data(data)
    tokenizer = task.load_tokenizer(choice)

    def fresh():
        model = task.build_model(choice, tokenizer, TrainConfig())
        model.train()
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        return model, optimizer

    def step(model, optimizer, rows):
        task.loss(model, collate(rows)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    torch.manual_seed(0)
    model, optimizer = fresh()
    train, _ = task.datasets(data, tokenizer, 256, model)
    collate = task.collator(tokenizer)
    batches = [[train[i] for i in range(j, j + 4)] for j in range(0, 16, 4)]
    for rows in batches[:2]:
        step(model, optimizer, rows)
    saved = {k: v.clone() for k, v in task.model_state(model).items()}
    saved_optimizer = copy.deepcopy(optimizer.state_dict())
    for rows in batches[2:]:
        step(model, optimizer, rows)

    torch.manual_seed(123)  # a different adapter init: everything must come from the checkpoint
    resumed, resumed_optimizer = fresh()
    task.load_model_state(resumed, saved)
    resumed_optimizer.load_state_dict(saved_optimizer)
    for rows in batches[2:]:
        step(resumed, resumed_optimizer, rows)
    final, again = task.model_state(model), task.model_state(resumed)
    assert final.keys() == again.keys()
    assert all(torch.equal(final[k], again[k]) for k in final)  # bit-exact, not close
