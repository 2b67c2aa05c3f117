"""workbench.tasks.causal_lm and causal_lm_data: data formats, the loss mask token by token, batches, the fast loss."""

from __future__ import annotations

import math

import pytest
import torch

from workbench.config import ModelChoice, TrainConfig
from workbench.errors import ConfigError, DataError
from workbench.sources.synthetic_llm import make_chat_dataset
from workbench.tasks.causal_lm import CausalLMTask, token_loss
from workbench.tasks.causal_lm_data import IGNORE, PaddingCollator, encode_chat

CHAT = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama_dir)


@pytest.fixture(scope="module")
def tiny_model(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)


def _runs(labels):
    """Contiguous runs of labelled tokens, as lists of ids."""
    runs, current = [], []
    for t in labels:
        if t == IGNORE:
            if current:
                runs.append(current)
            current = []
        else:
            current.append(t)
    return runs + ([current] if current else [])


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# ------------------------------------------------------------------- the loss mask
def test_chat_labels_only_the_assistant_turns_and_their_end_token(tokenizer):
    end = tokenizer.eos_token_id  # <|im_end|> for SmolLM2, also its pad token
    ids, labels = encode_chat(tokenizer, CHAT, max_length=512, loss_on="completion", end_ids={end})
    text = tokenizer.apply_chat_template(CHAT, tokenize=False)
    assert ids == _ids(tokenizer, text)  # nothing inserted: the template ends each turn with EOS
    # Exactly two labelled stretches: each answer and the <|im_end|> that closes it.
    assert _runs(labels) == [_ids(tokenizer, "Hello! How can I help?") + [end],
                             _ids(tokenizer, "Blue.") + [end]]
    # Everything else is -100, position by position: system, users, role headers, trailing newlines.
    first = ids.index(_ids(tokenizer, "Hello")[0])
    n_first = len(_ids(tokenizer, "Hello! How can I help?")) + 1
    last = len(ids) - 1 - len(_ids(tokenizer, "Blue.")) - 1  # the final token is the template's "\n"
    expected = [IGNORE] * len(ids)
    expected[first:first + n_first] = ids[first:first + n_first]
    expected[last:last + len(_ids(tokenizer, "Blue.")) + 1] = ids[last:last + len(_ids(tokenizer, "Blue.")) + 1]
    assert labels == expected
    assert tokenizer.decode(ids[first - 4:first]) == "<|im_start|>assistant\n"  # header: 4 tokens, unlabelled
    assert ids[-1] == _ids(tokenizer, "\n")[0] and labels[-1] == IGNORE


def test_pair_labels_only_the_completion(tokenizer):
    task = CausalLMTask(system_prompt="Be terse.")
    from datasets import Dataset, DatasetDict

    rows = [{"prompt": "What is 2+2?", "completion": "4"}]
    splits = DatasetDict({"train": Dataset.from_list(rows), "validation": Dataset.from_list(rows)})
    task.check_data(splits)
    assert task.format == "prompt_completion"
    train, _ = task.datasets(splits, tokenizer, 512)
    ids, labels = train[0]["input_ids"], train[0]["labels"]
    end = tokenizer.eos_token_id
    assert tokenizer.decode(ids) == ("<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\n"
                                     "What is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n")
    labelled = [i for i, t in enumerate(labels) if t != IGNORE]
    assert [ids[i] for i in labelled] == _ids(tokenizer, "4") + [end]
    assert labelled == [len(ids) - 3, len(ids) - 2]  # "4", "<|im_end|>"; the final "\n" is not


def test_loss_on_all_labels_every_token(tokenizer):
    ids, labels = encode_chat(tokenizer, CHAT, max_length=512, loss_on="all",
                              end_ids={tokenizer.eos_token_id})
    assert labels == ids


def test_eos_is_appended_where_the_template_puts_none(tokenizer):
    tokenizer = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    tokenizer.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}assistant: {% endif %}")
    end = tokenizer.eos_token_id
    ids, labels = encode_chat(tokenizer, CHAT[1:3], max_length=512, loss_on="completion", end_ids={end})
    assert ids[-1] == end and labels[-1] == end
    # The prompt ends "assistant: " and the answer is tokenized apart from it, as at inference.
    assert tokenizer.decode([t for t in labels if t != IGNORE]) == "Hello! How can I help?\n<|im_end|>"
    prompt = tokenizer.apply_chat_template(CHAT[1:2], tokenize=False, add_generation_prompt=True)
    assert ids[:len(_ids(tokenizer, prompt))] == _ids(tokenizer, prompt)


def test_text_rows_train_on_everything_with_eos(tokenizer):
    from datasets import Dataset, DatasetDict

    rows = [{"text": "The cat sat on the mat."}]
    task = CausalLMTask()
    train, _ = task.datasets(DatasetDict({"train": Dataset.from_list(rows), "validation": Dataset.from_list(rows)}),
                             tokenizer, 512)
    assert task.format == "text"
    assert train[0]["labels"] == train[0]["input_ids"] == _ids(tokenizer, rows[0]["text"]) + [tokenizer.eos_token_id]


def test_tokenizer_without_chat_template_is_refused_unless_simple_is_chosen(tiny_llama_dir, tmp_path):
    from transformers import AutoTokenizer

    plain = tmp_path / "plain"
    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    tok.chat_template = None
    tok.save_pretrained(plain)
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    data = make_chat_dataset(4, 2)
    task = CausalLMTask()
    task.check_data(data)
    with pytest.raises(DataError, match="no chat template") as err:
        task.load_tokenizer(ModelChoice(str(plain)))
    assert "chat_template='simple'" in err.value.fix
    simple = CausalLMTask(chat_template="simple")
    simple.check_data(data)
    tok = simple.load_tokenizer(ModelChoice(str(plain)))
    train, _ = simple.datasets(data, tok, 512)
    labelled = tok.decode([t for t in train[0]["labels"] if t != IGNORE])
    assert labelled == data["train"][0]["messages"][1]["content"] + tok.eos_token
    assert tok.decode(train[0]["input_ids"]).count("### Assistant:\n") == 1


@pytest.mark.parametrize(("rows", "message"), [
    ([{"messages": [{"role": "user", "content": "hi"}]}], "no assistant message"),
    ([{"messages": [{"role": "assistant", "content": "hi"}]}], "starts with the assistant"),
    ([{"messages": [{"role": "robot", "content": "hi"}, {"role": "assistant", "content": "x"}]}],
     "role 'robot'"),
    ([{"prompt": "q", "completion": ""}], "completion is empty"),
    ([{"question": "q", "answer": "a"}], "Cannot tell the data format"),
])
def test_bad_rows_are_found_before_training(rows, message):
    from datasets import Dataset, DatasetDict

    ds = Dataset.from_list(rows)
    with pytest.raises(DataError, match=message) as err:
        CausalLMTask().check_data(DatasetDict({"train": ds, "validation": ds}))
    assert err.value.fix


def test_rows_whose_answer_is_truncated_away_are_dropped(tokenizer):
    data = make_chat_dataset(20, 3)  # 65-105 tokens with SmolLM2's default system prompt
    task = CausalLMTask()
    task.check_data(data)
    train, _ = task.datasets(data, tokenizer, 80)
    # The run's own message (logged after "start"), naming the rows; no raw UserWarning.
    notice = next(text for text, level in task.notes if "left out" in text)
    assert f"{task.dropped['train']} of 20 train rows" in notice and "train split row" in notice
    assert task.dropped["train"] > 0 and len(train) > 0
    assert task.dropped["train"] + len(train) == 20
    assert max(train.lengths) <= 80
    assert all(any(t != IGNORE for t in labels[1:]) for labels in train.labels)
    with pytest.raises(DataError, match="raise max_length"):
        task.datasets(data, tokenizer, 40)


def test_settings_name_the_wrong_field():
    for kwargs, field in [({"finetune": "adapter"}, "finetune"), ({"lora_r": 0}, "lora_r"),
                          ({"lora_dropout": 1.0}, "lora_dropout"), ({"loss_on": "prompt"}, "loss_on"),
                          ({"chat_template": "chatml"}, "chat_template"),
                          ({"lora_target_modules": ()}, "lora_target_modules"),
                          ({"data_format": "csv"}, "data_format"), ({"task": "seq2seq"}, "task"),
                          ({"best_metric": "accuracy"}, "best_metric"),
                          ({"best_metric": "exact_match"}, "best_metric")]:
        with pytest.raises(ConfigError) as err:
            TrainConfig(**{"task": "causal_lm", **kwargs})
        assert err.value.field == field
    assert TrainConfig(lora_target_modules="q_proj").lora_target_modules == ("q_proj",)
    lm = TrainConfig(task="causal_lm")
    assert lm.selection_metric == "loss" and TrainConfig().selection_metric == "accuracy"
    assert TrainConfig(task="causal_lm", best_metric="exact_match", eval_generate=8).selection_metric \
        == "exact_match"


# ------------------------------------------------------------------------- batches
def test_collator_pads_by_mask_not_by_token_id(tokenizer):
    pad = tokenizer.pad_token_id
    assert pad == tokenizer.eos_token_id  # SmolLM2: the case that breaks id-based masking
    batch = PaddingCollator(pad)([{"input_ids": [5, 6, pad], "labels": [IGNORE, 6, pad]},
                                  {"input_ids": [7], "labels": [IGNORE]}])
    assert batch["input_ids"].tolist() == [[5, 6, pad], [7, pad, pad]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[IGNORE, 6, pad], [IGNORE, IGNORE, IGNORE]]
    task = CausalLMTask()
    assert task.rows(batch) == 2 and int(task.units(batch)) == 2


# -------------------------------------------------------------------------- losses
def _batch(tokenizer, n=6, max_length=512):
    data = make_chat_dataset(n, 2)
    task = CausalLMTask()
    task.check_data(data)
    train, _ = task.datasets(data, tokenizer, max_length)
    return task, task.collator(tokenizer)([train[i] for i in range(len(train))])


def test_fast_loss_equals_the_models_own_loss(tokenizer, tiny_model):
    task, batch = _batch(tokenizer)
    assert batch["attention_mask"].min() == 0  # padding present: it must not count
    fast = task.loss(tiny_model, batch)
    reference = tiny_model(**batch).loss
    assert abs(fast.item() - reference.item()) < 1e-5
    fast.backward()
    fast_grad = tiny_model.model.embed_tokens.weight.grad.clone()
    tiny_model.zero_grad()
    reference.backward()
    torch.testing.assert_close(fast_grad, tiny_model.model.embed_tokens.weight.grad, atol=1e-6, rtol=1e-4)
    tiny_model.zero_grad()


def test_fast_loss_through_a_peft_model(tokenizer, tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    from workbench.tasks import lora

    model = lora.wrap(AutoModelForCausalLM.from_pretrained(tiny_llama_dir), r=4, alpha=8, dropout=0.0,
                      targets=None)
    task, batch = _batch(tokenizer)
    assert abs(token_loss(model, batch).item() - model(**batch).loss.item()) < 1e-5


def test_eval_metrics_are_token_weighted(tokenizer, tiny_model):
    task, batch = _batch(tokenizer)
    with torch.no_grad():
        halves = [{k: v[:2] for k, v in batch.items()}, {k: v[2:] for k, v in batch.items()}]
        outputs = [task.eval_outputs(tiny_model, b) for b in halves]
        whole = task.loss(tiny_model, batch).item()
    summed, counts = outputs[0]
    assert summed.shape == counts.shape == (2,)
    assert counts.tolist() == (batch["labels"][:2, 1:] != IGNORE).sum(1).float().tolist()
    metrics = task.metrics(outputs)
    assert abs(metrics["eval_loss"] - whole) < 1e-5
    assert metrics["eval_perplexity"] == pytest.approx(math.exp(whole), rel=1e-5)


def test_generation_check_prompts_up_to_the_answer(tokenizer, tiny_model):
    from workbench.tasks.causal_lm_data import prompt_and_reference

    task, _ = _batch(tokenizer, n=4)
    data = make_chat_dataset(4, 2)
    train, evaluation = task.datasets(data, tokenizer, 512)
    prompt, reference = prompt_and_reference(evaluation[0])
    assert tokenizer.decode(prompt).endswith("<|im_start|>assistant\n")
    assert tokenizer.decode(reference) == data["validation"][0]["messages"][1]["content"] + "<|im_end|>"
    assert prompt_and_reference({"input_ids": [1, 2], "labels": [1, 2]}) == (None, [])

    # A model that always answers with the reference gets 1.0; the random tiny model gets 0.
    assert task.generation_check(tiny_model, tokenizer, evaluation, limit=2, max_new_tokens=4) == \
        {"eval_exact_match": 0.0}

    class Oracle(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def generate(self, input_ids, **kwargs):
            for i in range(len(evaluation)):
                p, r = prompt_and_reference(evaluation[i])
                if p == input_ids[0].tolist():
                    return torch.tensor([p + r])
            raise AssertionError("prompt not from the eval split")

    assert task.generation_check(Oracle(), tokenizer, evaluation, limit=2) == {"eval_exact_match": 1.0}


def test_flattened_batches_split_at_example_boundaries():
    # CUDA + FlashAttention batches are one row of examples end to end; an out-of-memory
    # retry must cut them between examples, with the sequence offsets of each piece.
    from transformers import DataCollatorWithFlattening

    from workbench.tasks.base import split_batch

    rows = [{"input_ids": list(range(10, 10 + n)), "labels": [IGNORE] + list(range(11, 10 + n))}
            for n in (3, 5, 2, 4, 6)]
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=True)(rows)
    task = CausalLMTask()
    assert task.rows(batch) == 5
    pieces = split_batch(task, batch, 2)
    assert [task.rows(p) for p in pieces] == [2, 2, 1]
    for key in ("input_ids", "labels", "position_ids"):
        assert torch.equal(torch.cat([p[key] for p in pieces], dim=1), batch[key])
    assert pieces[0]["cu_seq_lens_q"].tolist() == [0, 3, 8] and pieces[0]["max_length_q"] == 5
    assert pieces[1]["cu_seq_lens_k"].tolist() == [0, 2, 6] and pieces[1]["max_length_k"] == 4
    assert pieces[2]["cu_seq_lens_q"].tolist() == [0, 6]
    assert sum(int(task.units(p)) for p in pieces) == int(task.units(batch))
