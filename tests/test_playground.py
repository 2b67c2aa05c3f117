"""widgets.playground as Python objects: base and fine-tuned answers, streamed, from a saved adapter."""

from __future__ import annotations

import pytest
import torch

from workbench.config import ModelChoice, TrainConfig
from workbench.tasks.causal_lm import CausalLMTask


@pytest.fixture(scope="module")
def adapter_dir(tiny_llama_dir, tmp_path_factory):
    """A LoRA adapter on the tiny Llama whose B matrices are non-zero, so it changes the answers."""
    choice = ModelChoice(str(tiny_llama_dir))
    task = CausalLMTask(lora_r=8, lora_alpha=64, lora_dropout=0.0)
    tokenizer = task.load_tokenizer(choice)
    model = task.build_model(choice, tokenizer, TrainConfig())
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return task.save_model(model, tokenizer, tmp_path_factory.mktemp("adapter") / "model")


def _greedy(model, tokenizer, prompt: str, n: int) -> str:
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=n, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)


def test_base_and_tuned_answers_side_by_side_from_an_adapter_folder(adapter_dir, tiny_llama_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.widgets.playground import Playground

    playground = Playground.from_adapter(adapter_dir, max_new_tokens=6, temperature=0.0)
    updates = []
    playground.tuned_answer.observe(lambda change: updates.append(change["new"]), names="value")
    playground.generate("Name a colour.", wait=True)
    assert playground.errors == [] and playground.status.value == "done"
    assert not playground.button.disabled

    tokenizer = AutoTokenizer.from_pretrained(adapter_dir)
    base = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    expected_base = _greedy(base, tokenizer, "Name a colour.", 6)
    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_llama_dir), adapter_dir).eval()
    expected_tuned = _greedy(tuned, tokenizer, "Name a colour.", 6)
    assert expected_base != expected_tuned  # the adapter matters, so the columns can be told apart
    assert playground.base_answer.value == expected_base
    assert playground.tuned_answer.value == expected_tuned
    assert len([u for u in updates if u]) > 1  # streamed piece by piece, not set once at the end


def test_sampling_settings_and_errors_land_in_the_status(adapter_dir):
    from workbench.widgets.playground import Playground

    playground = Playground.from_adapter(adapter_dir, max_new_tokens=4)
    playground.temperature.value, playground.top_p.value = 0.8, 0.5
    assert playground._settings() == {"max_new_tokens": 4, "do_sample": True, "temperature": 0.8, "top_p": 0.5}

    def broken(**kwargs):
        raise RuntimeError("CUDA out of memory")

    playground.model.generate = broken
    playground.generate("hello", wait=True)
    assert playground.errors and "CUDA out of memory" in playground.errors[0]
    assert "out of memory" in playground.status.value and not playground.button.disabled


def test_earlier_models_get_their_own_columns_left_of_base_and_tuned(adapter_dir, tiny_llama_dir):
    """After preference tuning: the pretrained model, the SFT model (adapter off) and the tuned one."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.widgets.playground import Playground

    tokenizer = AutoTokenizer.from_pretrained(adapter_dir)
    other = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    torch.manual_seed(3)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p) * 0.2)  # another model: its greedy answer differs
    playground = Playground.from_adapter(adapter_dir, earlier={"pretrained": other}, max_new_tokens=6,
                                         temperature=0.0, titles=("SFT (adapter off)", "preference-tuned"))
    assert list(playground.answers) == ["pretrained", "SFT (adapter off)", "preference-tuned"]
    playground.generate("Name a colour.", wait=True)
    assert playground.errors == [] and playground.status.value == "done"
    assert playground.answers["pretrained"].value == _greedy(other, tokenizer, "Name a colour.", 6)
    assert playground.answers["SFT (adapter off)"].value == playground.base_answer.value
    assert playground.base_answer.value == _greedy(AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval(),
                                                   tokenizer, "Name a colour.", 6)
    assert len({a.value for a in playground.answers.values()}) == 3
    with pytest.raises(ValueError, match="titles"):
        Playground(other, tokenizer, earlier={"fine-tuned": other})
