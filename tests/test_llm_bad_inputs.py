"""Bad inputs on the language-model path, each through fit() and through `workbench train --config`.

Every case checks the message (what is wrong, where in the user's file, "Fix: ...") and that
nothing that looks like a good model (model/, best/) was written. The CLI is called in-process
(``workbench.cli.main``: the command's own code, without a new interpreter per case); one case
runs the real command in a subprocess. The model is the tiny random Llama with SmolLM2's
tokenizer and chat template (tests/llm_fixtures.py); the divergence case needs a model that
has learned something, so it first trains that tiny model for a few steps (``trained_llama``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml

from workbench import cli
from workbench.config import DatasetChoice, TrainConfig
from workbench.engine import checkpoint
from workbench.engine.train import fit
from workbench.errors import CheckpointError, ConfigError, DataError, ModelError, TrainingError
from workbench.sources import gguf
from workbench.sources.data import load_splits
from workbench.sources.synthetic_llm import make_chat_dataset, make_chat_rows
from workbench.tasks.causal_lm import CausalLMTask
from workbench.tasks.causal_lm_data import IGNORE

LORA = {"task": "causal_lm", "lora_r": 4, "lora_alpha": 8, "learning_rate": 3e-3, "batch_size": 8,
        "max_length": 160, "num_workers": 0, "log_every": 1}


@pytest.fixture(autouse=True)
def _few_threads():
    torch.set_num_threads(2)


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _config(tmp_path: Path, model, data, name="run.yaml", data_section=None, **train) -> Path:
    spec = {"model": {"name_or_path": str(model)},
            "data": data_section or {"source": "files", "path": str(data), "eval_split": None,
                                     "validation_fraction": 0.25},
            "train": {**LORA, "max_steps": 1, "output_dir": str(tmp_path / "cli-run"), **train}}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def _cli(capsys, config: Path, *extra: str) -> tuple[int, str]:
    """`workbench train --config FILE` in this process: (exit code, what it printed)."""
    code = cli.main(["train", "--config", str(config), "--progress", "none", *extra])
    out = capsys.readouterr()
    return code, out.out + out.err


def _nothing_saved(out: Path) -> None:
    assert not (out / "model").exists() and not (out / "best").exists()


def _messages(result, level=None) -> list[str]:
    return [e["text"] for e in result.history if e["kind"] == "message" and level in (None, e["level"])]


def _chat(user: str, answer: str, system: str | None = None) -> dict:
    turns = [{"role": "system", "content": system}] if system else []
    return {"messages": [*turns, {"role": "user", "content": user}, {"role": "assistant", "content": answer}]}


# ------------------------------------------------------------- empty answers, file rows
def test_empty_assistant_turns_are_refused_with_the_file_lines(tiny_llama_dir, tmp_path, capsys):
    rows = make_chat_rows(12, seed=1)
    rows[2]["messages"][1]["content"] = ""  # file line 3
    rows[5]["messages"][1]["content"] = "  \n "  # file line 6
    data = _jsonl(tmp_path / "chats.jsonl", rows)
    out = tmp_path / "run"
    with pytest.raises(DataError) as err:
        fit(str(tiny_llama_dir), str(data), output_dir=str(out), max_steps=1, **LORA)
    text = str(err.value)
    # The lines of the user's file, never the shuffled split's row numbers.
    named = set(re.findall(rf"{re.escape(str(data))} line (\d+)", text))
    assert named and named <= {"3", "6"}, text
    assert "split row" not in text and "empty or whitespace-only" in text and "Fix: " in text
    _nothing_saved(out)

    code, printed = _cli(capsys, _config(tmp_path, tiny_llama_dir, data))
    assert code == 2 and "empty or whitespace-only" in printed and f"{data} line " in printed
    assert "Traceback" not in printed and "Fix: " in printed
    _nothing_saved(tmp_path / "cli-run")


def test_a_bad_row_of_a_validation_file_is_named_by_that_file_and_line(tiny_llama_dir, tmp_path):
    folder = tmp_path / "chats"
    folder.mkdir()
    _jsonl(folder / "train.jsonl", make_chat_rows(8, seed=2))
    rows = make_chat_rows(4, seed=3)
    rows[1]["messages"][1]["content"] = ""
    _jsonl(folder / "validation.jsonl", rows)
    with pytest.raises(DataError, match=re.escape(f"{folder / 'validation.jsonl'} line 2: assistant message 1 is "
                                                  "empty")):
        fit(str(tiny_llama_dir), str(folder), output_dir=str(tmp_path / "run"), max_steps=1, **LORA)


def test_the_real_command_exits_2_with_one_clear_line(tiny_llama_dir, tmp_path):
    rows = make_chat_rows(8, seed=4)
    rows[3]["messages"][1]["content"] = " "
    config = _config(tmp_path, tiny_llama_dir, _jsonl(tmp_path / "chats.jsonl", rows))
    done = subprocess.run([sys.executable, "-m", "workbench", "train", "--config", str(config)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "chats.jsonl line 4" in done.stderr and "Fix: " in done.stderr and "Traceback" not in done.stderr


# -------------------------------------------------------------------------- divergence
@pytest.fixture(scope="module")
def trained_llama(tiny_llama_dir, tmp_path_factory) -> Path:
    """The tiny Llama after 12 full fine-tuning steps: loss ~2.8, far below ln(49152) = 10.8,
    like a pretrained model (a random one starts at the uniform loss and has nowhere to diverge to)."""
    out = tmp_path_factory.mktemp("trained") / "run"
    result = fit(str(tiny_llama_dir), make_chat_dataset(64, 8), output_dir=str(out), task="causal_lm",
                 finetune="full", learning_rate=1e-2, batch_size=8, max_length=160, num_workers=0,
                 max_steps=12, warmup_ratio=0.0, log_every=1)
    assert result.metrics["eval_loss"] < 5
    return result.model_dir


def test_a_language_model_at_learning_rate_1e4_stops_before_anything_is_saved(trained_llama, tmp_path, capsys):
    data = _jsonl(tmp_path / "chats.jsonl", make_chat_rows(48, seed=7))
    out = tmp_path / "run"
    with pytest.raises(TrainingError) as err:
        fit(str(trained_llama), str(data), output_dir=str(out), **{**LORA, "learning_rate": 1e4, "max_steps": 8})
    text = str(err.value)
    assert "The loss diverged" in text and "ln(49152) = 10.80" in text and "Fix: lower learning_rate" in text
    assert err.value.step is not None and err.value.step <= 8
    _nothing_saved(out)
    ended = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()][-1]
    assert ended["kind"] == "end" and ended["status"] == "failed"

    code, printed = _cli(capsys, _config(tmp_path, trained_llama, data, learning_rate=1e4, max_steps=8))
    assert code == 2 and "The loss diverged" in printed and "Traceback" not in printed
    _nothing_saved(tmp_path / "cli-run")


def test_a_classifier_at_a_huge_learning_rate_stops_before_anything_is_saved(tiny_bert, tmp_path, capsys):
    from workbench.sources.synthetic import make_dataset

    data = make_dataset(96, 32, seed=5)
    out = tmp_path / "run"
    settings = dict(learning_rate=1.0, batch_size=8, num_workers=0, max_length=128, max_steps=12, log_every=1,
                    warmup_ratio=0.0)
    with pytest.raises(TrainingError) as err:
        fit(str(tiny_bert), data, output_dir=str(out), **settings)
    assert "The loss diverged" in str(err.value) and "ln(2) = 0.69" in str(err.value)
    assert "Fix: lower learning_rate (it is 1; try 0.1)" in str(err.value)
    _nothing_saved(out)

    folder = tmp_path / "csv"
    folder.mkdir()
    for split in ("train", "validation"):
        data[split].to_csv(folder / f"{split}.csv", index=False)
    config = _config(tmp_path, tiny_bert, None, data_section={
        "source": "files", "path": str(folder), "text_columns": ["text"], "label_column": "label"},
        **{"task": "classification", **settings})
    code, printed = _cli(capsys, config)
    assert code == 2 and "The loss diverged" in printed and "Traceback" not in printed
    _nothing_saved(tmp_path / "cli-run")


def test_the_guard_needs_a_sustained_window_far_above_the_start():
    from workbench.engine.divergence import DivergenceGuard, threshold

    assert threshold(2.0, 10.8) == pytest.approx(0.85 * 10.8)  # a pretrained LM: near the uniform loss
    assert threshold(0.693, 0.693) == pytest.approx(1.193)  # a new binary head: far above its start
    guard = DivergenceGuard(num_classes=49152, total_steps=40)
    for step, loss in enumerate([2.0, 2.1, 30.0, 1.9, 1.8, 11.0, 1.7, 1.6], start=1):  # two lone spikes
        guard.observe(step, loss)
        assert guard.diverged() is None and guard.diverged(partial=True) is None
    for step, loss in enumerate([10.8, 10.8, 10.7], start=9):
        guard.observe(step, loss)
    assert guard.diverged() == (9, 11, 10.8)  # 3 of the last 4 steps at chance level
    assert guard.is_diverged_value(10.0) and not guard.is_diverged_value(3.0)


# ---------------------------------------------------------------------- system prompt
def test_system_prompt_goes_first_in_chats_without_one(tiny_llama_dir, tmp_path, capsys):
    from transformers import AutoTokenizer

    rows = [_chat(f"Question {i}?", f"Answer {i}.") for i in range(6)]
    rows += [_chat(f"Q {i}?", f"A {i}.", system="Talk like a pirate.") for i in range(2)]
    data = _jsonl(tmp_path / "chats.jsonl", rows)
    task = CausalLMTask(TrainConfig(task="causal_lm", system_prompt="Be terse."))
    splits = load_splits(DatasetChoice(source="files", path=str(data), eval_split=None,
                                       validation_fraction=0.25))
    task.check_data(splits)
    train, _ = task.datasets(splits, AutoTokenizer.from_pretrained(tiny_llama_dir), 256)
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    texts = [tokenizer.decode(ids) for ids in train.input_ids]
    assert all(("Be terse." in t) != ("pirate" in t) for t in texts)  # the row's own system message wins
    assert all(t.startswith("<|im_start|>system\n") for t in texts)

    out = tmp_path / "run"
    result = fit(str(tiny_llama_dir), str(data), output_dir=str(out), system_prompt="Be terse.",
                 max_steps=1, **LORA)
    assert any(re.match(r"system_prompt is put first in \d of \d train conversations; \d have a system", m)
               for m in _messages(result))
    code, printed = _cli(capsys, _config(tmp_path, tiny_llama_dir, data, system_prompt="Be terse."))
    assert code == 0 and "system_prompt is put first in" in printed


def test_system_prompt_and_eval_generate_on_plain_text_are_refused(tiny_llama_dir, tmp_path, capsys):
    data = _jsonl(tmp_path / "text.jsonl", [{"text": f"Document {i} about colors."} for i in range(8)])
    out = tmp_path / "run"
    with pytest.raises(ConfigError) as err:
        fit(str(tiny_llama_dir), str(data), output_dir=str(out), eval_generate=4, max_steps=1, **LORA)
    assert err.value.field == "eval_generate" and "nan" in err.value.fix and "text rows" in err.value.fix
    with pytest.raises(ConfigError) as err:
        fit(str(tiny_llama_dir), str(data), output_dir=str(out), system_prompt="Hi", max_steps=1, **LORA)
    assert err.value.field == "system_prompt"
    assert not out.exists()  # refused before the output folder is made
    code, printed = _cli(capsys, _config(tmp_path, tiny_llama_dir, data, eval_generate=4))
    assert code == 2 and "eval_generate=4 is not valid" in printed and "Fix: set eval_generate: 0" in printed
    assert not (tmp_path / "cli-run").exists()


# ---------------------------------------------------------------------- chat templates
def test_a_template_with_a_syntax_error_is_refused_before_anything_loads(tmp_path, capsys):
    broken = "{% for m in messages %}\n{{ m['content'] }\n{% endfor %}"
    with pytest.raises(ConfigError) as err:
        fit("no/such-model", make_chat_dataset(4, 2), output_dir=str(tmp_path / "run"), chat_template=broken,
            **LORA)
    assert err.value.field == "chat_template" and "line 2 of the template" in err.value.fix
    assert "Fix: " in str(err.value) and not (tmp_path / "run").exists()
    code, printed = _cli(capsys, _config(tmp_path, "no/such-model", tmp_path / "absent.jsonl",
                                         chat_template=broken))
    # The parameter file's line of chat_template, and the template's own line.
    assert code == 2 and re.search(r"run\.yaml, line \d+: chat_template=", printed)
    assert "line 2 of the template" in printed and "Traceback" not in printed


def test_a_template_that_never_renders_answers_is_blamed_not_truncation(tiny_llama_dir, tmp_path, capsys):
    no_answers = ("{% for m in messages %}{% if m['role'] != 'assistant' %}{{ m['content'] }}\n{% endif %}"
                  "{% endfor %}{% if add_generation_prompt %}Answer:{% endif %}")
    data = _jsonl(tmp_path / "chats.jsonl", make_chat_rows(8, seed=5))
    out = tmp_path / "run"
    with pytest.raises(DataError) as err:
        fit(str(tiny_llama_dir), str(data), output_dir=str(out), chat_template=no_answers, max_steps=1, **LORA)
    text = str(err.value)
    assert "does not render assistant turns" in text and f"{data} line " in text
    assert "truncation" not in text and "max_length" not in text
    _nothing_saved(out)
    code, printed = _cli(capsys, _config(tmp_path, tiny_llama_dir, data, chat_template=no_answers))
    assert code == 2 and "does not render assistant turns" in printed


def test_a_template_error_on_a_row_names_the_row(tiny_llama_dir, tmp_path):
    strict = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}"
              "{% endif %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
              "{% if add_generation_prompt %}assistant: {% endif %}")
    rows = [_chat(f"Q{i}", f"A{i}") for i in range(6)] + [_chat("Q", "A", system="S")]
    data = _jsonl(tmp_path / "chats.jsonl", rows)
    with pytest.raises(DataError, match=r"fails on .*chats\.jsonl line 7: no system role") as err:
        fit(str(tiny_llama_dir), str(data), output_dir=str(tmp_path / "run"), chat_template=strict,
            max_steps=1, **{**LORA, "batch_size": 2})
    assert "Fix: " in str(err.value)


# ------------------------------------------------------------------------- LoRA targets
def test_lora_on_a_norm_layer_is_refused_with_the_layers_that_can_be_adapted(tiny_llama_dir, tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(ConfigError) as err:
        fit(str(tiny_llama_dir), make_chat_dataset(8, 4), output_dir=str(out), max_steps=1,
            lora_target_modules=["q_proj", "input_layernorm"], **LORA)
    assert err.value.field == "lora_target_modules" and err.value.value == ["input_layernorm"]
    assert "'input_layernorm' is a LlamaRMSNorm" in err.value.fix and "q_proj, up_proj, v_proj" in str(err.value)
    assert not out.exists()  # found on an empty copy of the model, before the output folder is made
    data = _jsonl(tmp_path / "chats.jsonl", make_chat_rows(8))
    code, printed = _cli(capsys, _config(tmp_path, tiny_llama_dir, data, lora_target_modules=["norm"]))
    assert code == 2 and "'norm' is a LlamaRMSNorm" in printed and "Traceback" not in printed
    assert not (tmp_path / "cli-run").exists()


# ------------------------------------------------------------------------------- GGUF
def test_a_truncated_gguf_is_said_to_be_truncated_with_how_to_get_a_good_copy(tmp_path, capsys):
    source = gguf.smollm2_gguf()
    cut = tmp_path / "SmolLM2.Q4_1.gguf"
    with source.open("rb") as f:
        cut.write_bytes(f.read(20 * 2**20))
    out = tmp_path / "run"
    with pytest.raises(ModelError) as err:
        fit(str(cut), make_chat_dataset(4, 2), output_dir=str(out), **LORA)
    text = str(err.value)
    assert f"{cut} is truncated: it has 20,971,520 bytes" in text and "bytes are missing" in text
    assert "Fix: get a good copy: download it again" in text and not out.exists()
    code, printed = _cli(capsys, _config(tmp_path, cut, tmp_path / "absent.jsonl"))
    assert code == 2 and "is truncated" in printed

    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"GGUF" + b"\xff" * 4096)
    with pytest.raises(ModelError, match="not a usable GGUF file: its header is garbled"):
        gguf.check_gguf_file(garbage)


def test_a_gguf_and_the_folder_converted_from_it_are_the_same_model_on_resume(tmp_path, monkeypatch):
    def convert(path, out, dtype):
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(gguf, "_convert", convert)
    source = tmp_path / "m.gguf"
    source.write_bytes(b"GGUF" + bytes(range(256)) * 64)
    folder = gguf.convert_gguf(source, tmp_path / "converted")
    assert gguf.content_identity(source) == gguf.content_identity(folder) is not None
    assert gguf.content_identity(tmp_path) is None
    before = {"model": str(folder), "model_content": gguf.content_identity(folder), "task": "causal_lm"}
    checkpoint.check_same_run(tmp_path / "ckpt", before, {**before, "model": str(source),
                                                          "model_content": gguf.content_identity(source)})
    with pytest.raises(CheckpointError, match="a .gguf file and the folder converted from it count as the same"):
        checkpoint.check_same_run(tmp_path / "ckpt", before, {**before, "model": "other", "model_content": None})


@pytest.mark.slow
def test_resuming_the_real_smollm2_from_its_gguf_after_its_folder(smollm2_dir, tmp_path):
    data = make_chat_dataset(16, 4)
    out = tmp_path / "run"
    settings = {**LORA, "batch_size": 4, "max_length": 128, "output_dir": str(out), "save_every": 1}
    assert fit(str(smollm2_dir), data, max_steps=1, **settings).status == "completed"
    result = fit(str(gguf.smollm2_gguf()), data, max_steps=2, **settings)
    assert result.status == "completed" and result.history[0]["resumed_from_step"] == 1


# ---------------------------------------------------------------- config file messages
def test_a_missing_config_file_and_a_set_typo_end_in_a_fix(tmp_path, capsys):
    code, printed = _cli(capsys, tmp_path / "nope.yaml")
    assert code == 2 and "Fix: check the path" in printed
    config = _config(tmp_path, "no/such-model", tmp_path / "absent.jsonl")
    for typo, fix in (("train.lerning_rate=1e-4", "Fix: did you mean train.learning_rate?"),
                      ("trian.learning_rate=1e-4", "Fix: write it as --set train.num_epochs=1")):
        code, printed = _cli(capsys, config, "--set", typo)
        assert code == 2 and fix in printed, printed


# ------------------------------------------------------ rows left out, answers cut short
def test_left_out_rows_and_cut_answers_are_the_runs_own_messages(tiny_llama_dir, tmp_path, capsys):
    long_prompt = "Notes: " + " ".join(["The weather was mild all week."] * 12) + "\nQuestion: Why?"
    long_answer = "Because " + " ".join(["the wind came from the sea"] * 10) + "."
    data = tmp_path / "chats"
    data.mkdir()
    rows = [_chat(long_prompt, "Sun.") for _ in range(3)] + [_chat(f"Why {i}?", long_answer) for i in range(9)]
    _jsonl(data / "train.jsonl", rows)
    _jsonl(data / "validation.jsonl", [_chat(f"Why not {i}?", long_answer) for i in range(4)])
    settings = {**LORA, "max_length": 48, "max_steps": 1}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fit(str(tiny_llama_dir), str(data), output_dir=str(tmp_path / "run"), **settings)
    assert not [w for w in caught if "dropped" in str(w.message) or "left out" in str(w.message)]
    warned = _messages(result, "warn")
    left_out = next(m for m in warned if "rows were left out" in m)
    assert left_out.startswith("3 of 12 train rows were left out: their answer starts after max_length=48")
    assert all(f"{data / 'train.jsonl'} line {n}" in left_out for n in (1, 2, 3)) and "Raise max_length" in left_out
    assert any(m.startswith("every train answer is cut at max_length=48") for m in warned), warned
    code, printed = _cli(capsys, _config(tmp_path, tiny_llama_dir, None, max_length=48, data_section={
        "source": "files", "path": str(data)}))
    assert code == 0 and "rows were left out" in printed and "answer is cut at max_length=48" in printed


# ------------------------------------------------------------------ messy chat data
@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama_dir)


def _encode(tokenizer, rows, tmp_path, **settings):
    data = _jsonl(tmp_path / "messy.jsonl", rows)
    splits = load_splits(DatasetChoice(source="files", path=str(data), eval_split=None, validation_fraction=0.25))
    task = CausalLMTask(TrainConfig(task="causal_lm", **settings))
    task.check_data(splits)
    return task, task.datasets(splits, tokenizer, settings.get("max_length", 256))[0]


def test_sharegpt_rows_train_like_role_content_rows(tokenizer, tmp_path):
    plain = [_chat(f"Hi {i}", f"Hello {i}", system="Be kind.") for i in range(8)]
    sharegpt = [{"conversations": [{"from": {"system": "system", "user": "human", "assistant": "gpt"}[m["role"]],
                                    "value": m["content"]} for m in r["messages"]]} for r in plain]
    with pytest.raises(DataError, match="Fix: set messages_column: conversations"):
        _encode(tokenizer, sharegpt, tmp_path)
    _, ours = _encode(tokenizer, sharegpt, tmp_path, messages_column="conversations")
    _, theirs = _encode(tokenizer, plain, tmp_path)
    assert sorted(ours.input_ids) == sorted(theirs.input_ids) and sorted(ours.labels) == sorted(theirs.labels)


def test_tool_turns_and_image_parts_are_refused_text_parts_are_read(tokenizer, tmp_path):
    rows = make_chat_rows(6, seed=8)
    rows[4] = {"messages": [{"role": "user", "content": "Weather?"},
                            {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function"}]},
                            {"role": "tool", "content": "sunny"}, {"role": "assistant", "content": "Sunny."}]}
    with pytest.raises(DataError, match=r"messy\.jsonl line 5: message 1 is an assistant tool call"):
        _encode(tokenizer, rows, tmp_path)
    rows[4] = {"messages": [{"role": "user", "content": "Weather?"}, {"role": "function", "content": "sunny"},
                            {"role": "assistant", "content": "Sunny."}]}
    with pytest.raises(DataError, match=r"line 5: message 1 is role 'function': tool/function-calling"):
        _encode(tokenizer, rows, tmp_path)

    parts = [{"type": "text", "text": "What color"}, {"type": "text", "text": "is the sky?"}]
    rows[4] = {"messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": "Blue."}]}
    task, train = _encode(tokenizer, rows, tmp_path)  # one file mixing text and part-list contents
    assert any("What color\nis the sky?" in tokenizer.decode(ids) for ids in train.input_ids + task.eval_dataset.input_ids)
    rows[4]["messages"][0]["content"] = [*parts, {"type": "image_url", "image_url": {"url": "x.png"}}]
    with pytest.raises(DataError, match=r"line 5: message 0 has a 'image_url' content part: only text parts"):
        _encode(tokenizer, rows, tmp_path)


def test_mixed_formats_in_one_file_name_the_odd_rows(tokenizer, tmp_path):
    rows = make_chat_rows(6, seed=9) + [{"prompt": "2+2?", "completion": "4"}]
    with pytest.raises(DataError, match=r"messy\.jsonl line 7: it is a prompt/completion row, the others are "
                                        r"'messages' rows: one format per file"):
        _encode(tokenizer, rows, tmp_path)


def test_duplicated_rows_are_trained_with_a_warning(tokenizer, tmp_path):
    rows = make_chat_rows(6, seed=10)
    task, _ = _encode(tokenizer, rows + rows[:3], tmp_path)
    warned = " ".join(text for text, level in task.notes if level == "warn")
    assert "repeat an earlier train row" in warned or "also train rows" in warned


def test_a_very_long_conversation_is_cut_without_rendering_every_turn(tokenizer, tmp_path):
    turns = []
    for i in range(400):
        turns += [{"role": "user", "content": f"Tell me fact {i}."}, {"role": "assistant", "content": f"Fact {i}."}]
    rows = [{"messages": turns}] + make_chat_rows(5, seed=11)
    task, train = _encode(tokenizer, rows, tmp_path, max_length=128)
    assert max(train.lengths) <= 128
    everything = train.labels + task.eval_dataset.labels
    assert all(any(t != IGNORE for t in labels[1:]) for labels in everything)


def test_chats_as_json_text_in_a_csv_and_numbers_as_written_are_read(tokenizer, tmp_path):
    chats = tmp_path / "chats.csv"
    rows = [[{"role": "User", "content": f"q{i}"}, {"role": "ASSISTANT", "content": f"a{i}"}] for i in range(6)]
    chats.write_text("messages\n" + "".join('"' + json.dumps(r).replace('"', '""') + '"\n' for r in rows))
    splits = load_splits(DatasetChoice(source="files", path=str(chats), eval_split=None, validation_fraction=0.25))
    task = CausalLMTask(TrainConfig(task="causal_lm"))
    task.check_data(splits)  # JSON text parsed, role names in any case
    assert task.format == "messages"

    pairs = tmp_path / "pairs.csv"
    pairs.write_text("prompt,completion\n" + "".join(f"{i}+{i}?,00{2 * i}\n" for i in range(6)) + "half?,2.50\n")
    splits = load_splits(DatasetChoice(source="files", path=str(pairs), eval_split=None, validation_fraction=0.25))
    everything = list(splits["train"]["completion"]) + list(splits["validation"]["completion"])
    assert sorted(everything) == sorted([f"00{2 * i}" for i in range(6)] + ["2.50"])  # the text as written


def test_an_assistant_turn_with_weight_0_is_context_not_an_answer(tokenizer, tmp_path):
    rows = [{"messages": [{"role": "user", "content": f"q{i}"},
                          {"role": "assistant", "content": f"Draft {i}.", "weight": 0},
                          {"role": "user", "content": "Better?"},
                          {"role": "assistant", "content": f"Final {i}.", "weight": 1}]} for i in range(6)]
    _, train = _encode(tokenizer, rows, tmp_path)
    for ids, labels in zip(train.input_ids, train.labels, strict=True):
        supervised = tokenizer.decode([t for t in labels if t != IGNORE])
        assert "Final" in supervised and "Draft" not in supervised and "Draft" in tokenizer.decode(ids)
