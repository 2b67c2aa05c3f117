"""The pickers with a causal LM and chat data (no browser, no GPU): facts, estimates, token preview, export."""

from __future__ import annotations

import dataclasses
import html
import json
import re
import shutil
from pathlib import Path

import pytest

from workbench.config import RunSpec, TrainConfig
from workbench.errors import ConfigError, WorkbenchError
from workbench.sources.synthetic_llm import make_chat_rows
from workbench.widgets.pickers import DatasetPicker, ModelPicker, pickers

GiB = 2**30


@pytest.fixture()
def models_dir(tiny_bert, tmp_path, monkeypatch):
    root = tmp_path / "models"
    shutil.copytree(tiny_bert, root / "tiny-bert")
    monkeypatch.setenv("WORKBENCH_MODELS", str(root))
    return root


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture()
def chat_file(tmp_path) -> Path:
    return write_jsonl(tmp_path / "chat.jsonl", make_chat_rows(12))


def spans(preview: str, kind: str) -> list[str]:
    """The text of every ``wb-<kind>`` span of a token preview, unescaped."""
    return [html.unescape(t) for t in re.findall(rf"<span class='wb-{kind}'[^>]*>(.*?)</span>", preview, re.S)]


def verdicts(estimate: str) -> dict[str, str]:
    """Mode -> the 'Fits?' cell of the causal estimate table."""
    rows = re.findall(r"<tr class='wb-mode-(\w+)'[^>]*>(.*?)</tr>", estimate, re.S)
    return {mode: re.findall(r"<td>(.*?)</td>", cells)[-1] for mode, cells in rows}


# ---------------------------------------------------------------- model picker


def test_causal_lm_shows_its_facts_and_three_estimates(tiny_llama_dir):
    picker = ModelPicker(free_bytes=80 * GiB)
    picker.select(str(tiny_llama_dir))
    assert picker.task == "causal_lm" and picker.task_box.value == "causal_lm"
    assert picker.finetune_box.layout.display is None  # the mode chooser appears
    facts = picker.facts
    assert (facts.num_layers, facts.num_heads, facts.num_kv_heads, facts.context_length) == (2, 4, 2, 1024)
    details = picker.details.value
    for row in ("<th style='text-align:left'>Layers</th><td>2</td>", "KV heads</th><td>2 (grouped-query)",
                "Context length</th><td>1024", "Tied embeddings</th><td>yes", "Chat template</th><td>yes"):
        assert row in details
    assert sorted(picker.causal_fit.estimates) == sorted(
        (mode, ckpt) for mode in ("full", "lora", "qlora") for ckpt in (False, True))
    assert verdicts(picker.estimate.value) == {"full": "fits", "lora": "fits", "qlora": "fits"}
    assert "Fits: needs about" in picker.estimate.value and "Full, LoRA, QLoRA" in picker.estimate.value
    # the chosen mode's row is the bold one, and follows the selector
    assert "wb-mode-lora' style='font-weight:bold'" in picker.estimate.value
    picker.finetune_box.value = "full"
    assert "wb-mode-full' style='font-weight:bold'" in picker.estimate.value
    assert picker.fit is None and picker.message.value == ""


def test_causal_fit_follows_free_memory(tiny_llama_dir):
    probe = ModelPicker(free_bytes=80 * GiB)
    probe.select(str(tiny_llama_dir))
    totals = {mode: min(probe.causal_fit.estimates[(mode, ckpt)].total_bytes for ckpt in (False, True))
              for mode in ("full", "lora", "qlora")}
    # between the cheapest mode and the dearest: some fit, some do not
    free = (min(totals.values()) + max(totals.values())) // 2
    picker = ModelPicker(free_bytes=free)
    picker.select(str(tiny_llama_dir))
    shown = verdicts(picker.estimate.value)
    for mode, total in totals.items():
        assert shown[mode].startswith("fits") == (total <= free), (mode, total, free, shown)
    assert set(shown.values()) & {"fits", "fits with checkpointing"} and "does not fit" in shown.values()
    assert picker.causal_fit.fitting_modes == [m for m in ("full", "lora", "qlora") if totals[m] <= free]

    lora = {ckpt: probe.causal_fit.estimates[("lora", ckpt)].total_bytes for ckpt in (False, True)}
    assert lora[True] < lora[False]  # checkpointing keeps one layer's activations, not all
    between = ModelPicker(free_bytes=(lora[True] + lora[False]) // 2)
    between.select(str(tiny_llama_dir))
    assert verdicts(between.estimate.value)["lora"] == "fits with checkpointing"
    assert "Will not fit" in between.estimate.value  # the chosen run (LoRA, no checkpointing)
    between.gradient_checkpointing = True
    assert between.estimate.value.startswith("<div style='color:#1b5e20'>Fits: ")

    small = ModelPicker(free_bytes=100 * 2**20)  # less than the CUDA context alone
    small.select(str(tiny_llama_dir))
    assert set(verdicts(small.estimate.value).values()) == {"does not fit"}
    assert "Will not fit" in small.estimate.value and "Modes that fit: none of them" in small.estimate.value


def test_classifier_keeps_todays_view(models_dir, tiny_llama_dir):
    picker = ModelPicker(free_bytes=80 * GiB)
    picker.select(str(models_dir / "tiny-bert"))
    assert picker.task == "classification" and picker.finetune_box.layout.display == "none"
    assert picker.details.value.startswith("<div style='color:#333'>BertForSequenceClassification")
    assert "wb-causal" not in picker.details.value + picker.estimate.value
    assert picker.fit is not None and picker.causal_fit is None
    assert picker.estimate.value.startswith("<div style='color:#1b5e20'>Fits: needs about")

    picker.select(str(tiny_llama_dir))  # a decoder after a classifier: the causal view
    assert picker.task == "causal_lm" and "wb-causal-estimate" in picker.estimate.value
    picker.task = "classification"  # the user wants a classifier on the decoder: today's view
    assert picker.fit is not None and picker.causal_fit is None
    assert "wb-causal" not in picker.details.value + picker.estimate.value

    picker.select(str(models_dir / "tiny-bert"))
    picker.task_box.value = "causal_lm"  # an encoder asked to be a causal LM: said, not estimated
    assert "is not a causal language model" in picker.message.value and picker.estimate.value == ""


# ---------------------------------------------------------------- dataset picker


def test_chat_preview_highlights_exactly_the_assistant_tokens(tiny_llama_dir, chat_file):
    first = make_chat_rows(12)[0]["messages"]
    picker = DatasetPicker()
    picker.model_name = str(tiny_llama_dir)
    picker.path = str(chat_file)
    assert picker.load(), picker.message.value
    assert picker.task == "causal_lm"  # recognised from the messages column
    assert picker.label_columns.layout.display == "none" and picker.chat.layout.display is None
    assert "Choose the text column" not in picker.message.value  # no label column asked for
    preview = picker.chat.preview.value
    assert "".join(spans(preview, "loss")) == first[1]["content"] + "<|im_end|>"
    prompt = "".join(spans(preview, "prompt"))
    assert first[0]["content"] in prompt and "<|im_start|>assistant\n" in prompt
    assert spans(preview, "cut") == []

    picker.max_length = 20  # the answer lies beyond the cut: nothing trains, and the preview says so
    preview = picker.chat.preview.value
    assert spans(preview, "loss") == [] and first[1]["content"] in "".join(spans(preview, "cut"))
    assert "the run drops it" in preview


def test_chat_preview_without_a_model_is_a_plain_chat(chat_file):
    picker = DatasetPicker()
    picker.path = str(chat_file)
    assert picker.load()
    preview = picker.chat.preview.value
    assert "wb-chat-plain" in preview and "wb-loss" not in preview
    assert "<b>assistant</b>: It is" in preview and "Choose a model" in preview
    assert picker.check(), picker.message.value  # the task's row check, not a label count
    assert "Every row is a valid messages example" in picker.distribution.value
    assert picker.chart.value == b""


def test_prompt_completion_rows_preview_the_completion(tiny_llama_dir, tmp_path):
    rows = make_chat_rows(8, fmt="prompt_completion")
    path = write_jsonl(tmp_path / "pairs.jsonl", rows)
    picker = DatasetPicker()
    picker.path = str(path)
    assert picker.load()
    assert picker.task == "causal_lm" and picker.chat.data_format == "prompt_completion"
    assert picker.dataset_choice.text_columns == ("prompt", "completion")
    picker.model_name = str(tiny_llama_dir)
    assert "".join(spans(picker.chat.preview.value, "loss")) == rows[0]["completion"] + "<|im_end|>"


def test_classification_data_is_not_taken_for_chats(tmp_path):
    from workbench.sources.synthetic import write_csv

    write_csv(tmp_path / "train.csv", 40)
    picker = DatasetPicker()
    picker.path = str(tmp_path / "train.csv")
    assert picker.load()
    assert picker.task == "classification" and picker.label_columns.layout.display is None
    assert picker.train_fields == {} and picker.dataset_choice.label_column == "label"


# ---------------------------------------------------------------- export


def test_export_writes_task_causal_lm_and_round_trips(tiny_llama_dir, tmp_path):
    from workbench.engine.inputs import resolve_data
    from workbench.tasks import make_task

    rows = [{"conversation": r["messages"]} for r in make_chat_rows(12)]  # not the default column name
    path = write_jsonl(tmp_path / "chat.jsonl", rows)
    both = pickers()
    both.model.select(str(tiny_llama_dir))
    both.model.finetune = "qlora"
    both.model.seq_len = 128
    both.dataset.path = str(path)
    assert both.dataset.load()
    assert both.dataset.task == "causal_lm" and both.dataset.chat.messages_column == "conversation"
    assert both.dataset.model_name == str(tiny_llama_dir)  # the model picker's choice renders the preview
    assert "".join(spans(both.dataset.chat.preview.value, "loss")).endswith("<|im_end|>")
    both.output_dir.value = str(tmp_path / "run")
    target = both.export(str(tmp_path / "run.yaml"), train=TrainConfig(num_epochs=1))
    assert target is not None, both.message.value
    assert "task: causal_lm" in target.read_text()
    loaded = RunSpec.load(target)
    assert loaded == both.run_spec(TrainConfig(num_epochs=1))
    t = loaded.train
    assert (t.task, t.finetune, t.max_length, t.num_epochs) == ("causal_lm", "qlora", 128, 1)
    assert (t.data_format, t.messages_column) == ("messages", "conversation")
    assert loaded.data.path == str(path)
    # what fit() does with it before training: resolve the data, check every row
    splits, _, _ = resolve_data(loaded.data, None, None, t.task)
    make_task(dataclasses.replace(t, finetune="lora"), (), None).check_data(splits)  # the rows pass
    with pytest.raises(ConfigError, match="NVIDIA GPU"):  # and QLoRA on this CPU is refused before training
        make_task(t, (), None).check_data(splits)
    lines = both.commands_text(config_path=str(target)).splitlines()
    assert lines[0] == f"workbench train --config {target}"
    assert lines[1].startswith("# papermill:") and "workbench train" in lines[1]

    both.model.task = "classification"  # flipped back: chats have no label column to export
    assert both.dataset.task == "classification" and both.dataset.label_columns.layout.display is None
    with pytest.raises(WorkbenchError, match="label columns are not chosen"):
        both.run_spec()


@pytest.mark.parametrize("native", [True, False], ids=["native-bf16-cpu", "emulated-bf16-cpu"])
def test_causal_estimate_without_a_gpu(tiny_llama_dir, monkeypatch, native):
    from workbench.engine import precision
    from workbench.sources import vram

    monkeypatch.setattr(vram, "_free_memory", lambda *args: (None, None, None))  # a machine with no GPU
    monkeypatch.setattr(precision, "cpu_bf16", lambda: precision.CpuBf16(native, "simulated"))
    picker = ModelPicker()
    picker.select(str(tiny_llama_dir))
    assert set(verdicts(picker.estimate.value).values()) == {"no GPU"}
    assert "No GPU: nothing to compare with" in picker.estimate.value
    ran = "bf16" if native else "fp32"  # auto on this CPU
    assert f"Full ({ran})" in picker.estimate.value and "QLoRA (bf16)" in picker.estimate.value
    assert picker.cpu_time.precision == ran and f"On this CPU in {ran}" in picker.estimate.value
