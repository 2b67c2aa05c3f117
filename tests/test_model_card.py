"""The model card (workbench/shipping/card.py): written into every saved model folder from the run folder.

The LoRA run is the session's tiny Llama run on chat files (tests/llm_fixtures.py); the
classifier run a 1-epoch tiny BERT. Nothing here may reach the network: the Hub-side
``ModelCard.validate`` and ``push_to_hub`` are made to fail if called.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import yaml

from workbench.shipping import card as cards


@pytest.fixture(autouse=True)
def no_hub_calls(monkeypatch):
    from huggingface_hub import ModelCard

    def refuse(*args, **kwargs):
        raise AssertionError("the model card must never call the Hub")

    monkeypatch.setattr(ModelCard, "validate", refuse)
    monkeypatch.setattr(ModelCard, "push_to_hub", refuse)


def _metadata(readme: Path) -> tuple[dict, str]:
    text = readme.read_text(encoding="utf-8")
    _, header, body = text.split("---\n", 2)
    return yaml.safe_load(header), body


def test_every_model_folder_of_a_lora_run_has_a_card_from_its_run(tiny_lora_run):
    record = json.loads((tiny_lora_run / "run.json").read_text())
    assert record["data"]["source"] == "files" and Path(record["data"]["path"]).is_dir()
    for name in ("model", "best", "model_merged"):
        meta, body = _metadata(tiny_lora_run / name / "README.md")
        assert "workbench" in meta["tags"] and "lora" in meta["tags"]
        assert meta["pipeline_tag"] == "text-generation"
        # What the issue asks a card to say, read from the run folder:
        assert record["data_fingerprint"] in body  # the data and its fingerprint
        assert str(record["data"]["path"]) in body
        assert "rank 4, alpha 8" in body  # LoRA settings
        assert "| learning rate | 0.003" in body
        assert f"| precision | {record['precision']} ({record['precision_reason']}) |" in body
        assert "| training time |" in body and "| hardware | CPU" in body
        assert "| transformers |" in body and "| peft |" in body  # library versions
        assert "<|im_start|>" in body  # the chat template, in a fence
        assert "pipeline(\"text-generation\"" in body and "workbench export RUN --gguf" in body
    # The adapter folder says how to load it on its base; peft's own template card is replaced.
    _, adapter_body = _metadata(tiny_lora_run / "model" / "README.md")
    assert "AutoPeftModelForCausalLM" in adapter_body and "[More Information Needed]" not in adapter_body
    meta, _ = _metadata(tiny_lora_run / "model" / "README.md")
    assert meta["library_name"] == "peft"
    # best/ names its own step, model/ the run's best.
    _, best_body = _metadata(tiny_lora_run / "best" / "README.md")
    best_step = json.loads((tiny_lora_run / "best" / "best.json").read_text())["step"]
    assert f"model of step {best_step}" in best_body


def test_results_compare_the_step_0_base_with_the_model_and_are_hub_eval_results(tiny_lora_run):
    meta, body = _metadata(tiny_lora_run / "model_merged" / "README.md")
    assert "| metric | base model (step 0) | this model |" in body
    events = [json.loads(line) for line in (tiny_lora_run / "events.jsonl").read_text().splitlines()]
    final = [e for e in events if e["kind"] == "eval"][-1]
    assert f"{final['eval_loss']:.4g}" in body
    # eval_results become a model-index whose task and dataset fields are filled (the Hub drops them otherwise).
    results = meta["model-index"][0]["results"]
    assert results and all(r["task"]["type"] == "text-generation" and r["dataset"]["type"] and r["dataset"]["name"]
                           for r in results)
    loss = next(m for r in results for m in r["metrics"] if m["type"] == "loss")
    assert loss["value"] == pytest.approx(final["eval_loss"], rel=1e-5)


def test_the_card_says_which_precision_ran_why_and_whether_the_run_learned(tiny_lora_run, tmp_path):
    """The precision's reason (issue 28) in the training table, the verdict (issue 27) opening the results;
    fields the record gains later still appear without a change to the card."""
    run = tmp_path / "run"
    shutil.copytree(tiny_lora_run, run, ignore=shutil.ignore_patterns("checkpoints", "tensorboard"))
    record = json.loads((run / "run.json").read_text())
    record["precision"], record["precision_reason"] = "bf16", "auto: bf16, this CPU computes it natively (AMX)"
    record["verdict"] = {"outcome": "no_better", "metric": "eval_loss",
                         "text": "Learned nothing: eval_loss 2.31 against 2.30 for the base model."}
    record["a_field_from_a_later_release"] = "shown as it is"
    (run / "run.json").write_text(json.dumps(record))
    _, body = _metadata(cards.write_card(run / "model", run))
    assert "| precision | bf16 (auto: bf16, this CPU computes it natively (AMX)) |" in body
    results = body.split("## Results on the held-out split", 1)[1].split("\n## ", 1)[0]
    assert "**Warning.**" in results and "Learned nothing: eval_loss 2.31 against 2.30" in results
    assert "`a_field_from_a_later_release` | shown as it is" in body
    assert "`verdict`" not in body and "`precision_reason`" not in body  # shown once, in their sections
    # A run that learned: the verdict without the warning.
    record["verdict"] = {"outcome": "better", "metric": "eval_loss", "text": "Learned: eval_loss 1.2 against 2.3."}
    (run / "run.json").write_text(json.dumps(record))
    _, body = _metadata(cards.write_card(run / "model", run))
    assert "Learned: eval_loss 1.2 against 2.3." in body and "**Warning.**" not in body


def test_a_card_never_costs_the_model(tmp_path, monkeypatch):
    folder = tmp_path / "run" / "model"
    folder.mkdir(parents=True)

    def broken(*args, **kwargs):
        raise RuntimeError("template trouble")

    monkeypatch.setattr(cards, "build_card", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cards.safe_write_card(folder, folder.parent) is None
    assert any("template trouble" in str(w.message) for w in caught)
    assert "could not be written (RuntimeError: template trouble)" in (folder / "README.md").read_text()


def test_a_classifier_run_card_says_how_to_classify(tiny_bert, sentiment_data, tmp_path):
    from workbench.engine.train import fit

    small = sentiment_data.__class__({"train": sentiment_data["train"].select(range(64)),
                                      "validation": sentiment_data["validation"].select(range(32))})
    out = tmp_path / "clf"
    fit(str(tiny_bert), small, output_dir=str(out), num_epochs=1, batch_size=16, max_length=32, num_workers=0,
        precision="fp32")
    meta, body = _metadata(out / "model" / "README.md")
    assert meta["pipeline_tag"] == "text-classification" and meta["library_name"] == "transformers"
    assert "pipeline(\"text-classification\"" in body
    assert "| labels | negative, positive |" in body
    assert "Chat template" not in body
    verdict = json.loads((out / "run.json").read_text())["verdict"]
    assert verdict["text"] in body  # the real run's verdict, whatever it was
