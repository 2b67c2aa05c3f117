"""A run's verdict (engine/verdict.py): runs that learned nothing, or made the model worse, say so at
the end, in their result, their end event, the runs table and the notebook view, and never write
best/. The baselines themselves (chance, the majority class of the training labels) are checked
by hand on small label sets."""

from __future__ import annotations

import io
import json
import math
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset, DatasetDict
from tqdm import tqdm

from workbench.engine import runs
from workbench.engine.progress import RunHistory, _chart_title
from workbench.engine.results import read_verdict, result_from_disk
from workbench.engine.train import fit
from workbench.engine.verdict import final_verdict, judge, margin, reference
from workbench.sources.synthetic import make_dataset, make_rows
from workbench.sources.synthetic_llm import make_chat_rows
from workbench.tasks.metrics import trivial_baselines
from workbench.widgets.progress import NotebookProgress

CLASSIFIER = dict(batch_size=8, max_length=64, num_workers=0, log_every=1, warmup_ratio=0.0, precision="fp32")


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _events(out):
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


def _messages(out, level):
    return [e["text"] for e in _events(out) if e["kind"] == "message" and e["level"] == level]


# ------------------------------------------------------------------------ the baselines
def test_chance_and_the_majority_class_of_the_training_labels():
    names = ["negative", "positive"]
    labels = torch.tensor([1] * 8 + [0] * 2)  # 80/20 validation rows
    got = trivial_baselines(labels, train_counts=[20, 80], names=names)
    chance, majority = got["baselines"]
    assert got["rows"] == 10
    assert chance["metrics"] == pytest.approx({"eval_loss": math.log(2), "eval_accuracy": 0.5,
                                               "eval_f1": (2 * 0.8 / 2.6 + 2 * 0.2 / 1.4) / 2})
    assert majority["detail"] == "always 'positive', 80% of the training labels"
    assert majority["metrics"]["eval_accuracy"] == pytest.approx(0.8)
    assert majority["metrics"]["eval_f1"] == pytest.approx((2 * 0.8 / 1.8) / 2)  # 0.444: F1 of one class of two
    assert majority["metrics"]["eval_loss"] == pytest.approx(-(0.8 * math.log(0.8) + 0.2 * math.log(0.2)))


def test_better_means_beyond_what_noise_alone_gives():
    assert margin("eval_accuracy", 0.5, rows=64) == pytest.approx(0.125)
    assert margin("eval_accuracy", 0.5, rows=10_000) == pytest.approx(0.01)  # never below a point
    assert margin("eval_loss", 2.0, rows=None) == pytest.approx(0.01)
    base = {"name": "chance", "value": 0.5, "rows": 64}
    assert judge("eval_accuracy", 0.63, base) == "better"
    assert judge("eval_accuracy", 0.60, base) == "no_better"
    assert judge("eval_accuracy", 0.30, base) == "worse"
    assert judge("eval_loss", 1.9, {"name": "the base model", "value": 1.41}) == "worse"
    assert judge("eval_accuracy", 0.9, None) == "unknown"


def test_a_language_model_is_judged_against_its_base_model_else_its_first_evaluation():
    state = SimpleNamespace(baselines={}, base_metrics={}, first_metrics={"eval_loss": 2.0, "step": 10},
                            metrics={"eval_loss": 1.5}, step=20, best_step=20)
    assert reference("eval_loss", state, for_best=True) is None  # best/ competes among the run's evaluations
    verdict = final_verdict("eval_loss", state, best_written=True)
    assert verdict["outcome"] == "better" and "the run's first evaluation (step 10" in verdict["text"]
    state.base_metrics = {"eval_loss": 1.4, "step": 0}
    verdict = final_verdict("eval_loss", state, best_written=False)
    assert verdict["outcome"] == "worse" and verdict["baseline"] == "the base model"
    assert "best/ was not written" in verdict["text"]
    state.base_metrics, state.first_metrics = {}, {"eval_loss": 1.5, "step": 20}
    assert final_verdict("eval_loss", state, best_written=True)["outcome"] == "unknown"  # one evaluation only


# --------------------------------------------------------------------------- real runs
def test_a_classifier_flat_at_ln2_is_said_to_have_learned_nothing_everywhere(tiny_bert, tmp_path, capsys):
    """Every row has the same text and the labels alternate: no model can tell the rows apart, so
    every evaluation is exactly 0.5 (its loss at best ln 2) on any CPU and at any rate. (A run
    ruined by too high a rate alone was borderline: one CI run ended at 0.28, 'worse'.)"""
    out = tmp_path / "flat"
    labels = ("negative", "positive")
    same_text = DatasetDict(
        train=Dataset.from_list([{"text": "The film is overall forgettable.", "label": labels[i % 2]}
                                 for i in range(160)]),
        validation=Dataset.from_list([{"text": "The film is overall forgettable.", "label": labels[i % 2]}
                                      for i in range(64)]))
    result = fit(str(tiny_bert), same_text, output_dir=str(out), learning_rate=0.05,
                 max_steps=30, eval_every=10, **CLASSIFIER)
    # The result
    assert result.status == "completed" and result.learned is False
    assert result.verdict["outcome"] == "no_better" and result.verdict["metric"] == "eval_accuracy"
    assert result.metrics["eval_accuracy"] == pytest.approx(0.5) and result.verdict["best_step"] is None
    assert "verdict='no_better'" in repr(result)
    # The folder: the final model for inspection, no best/
    assert (out / "model").is_dir() and not (out / "best").exists() and result.best_checkpoint is None
    # The end of the run: said, as a warning, with what to try; and once, when best/ was first refused
    warnings = _messages(out, "warn")
    assert any(w.startswith("Learned nothing: eval_accuracy 0.5 against 0.5 for chance") and "What to try" in w
               for w in warnings)
    assert sum("so it is not kept as best/" in w for w in warnings) == 1
    assert "Learned nothing" in capsys.readouterr().err  # no view attached: printed
    # The end event and the run record, read back from the folder by anything; the model card of model/
    assert read_verdict(out) == result.verdict == result_from_disk(out).verdict
    assert json.loads((out / "run.json").read_text())["verdict"] == result.verdict
    assert "Learned nothing: eval_accuracy 0.5" in (out / "model" / "README.md").read_text()
    # The runs table
    row = runs.read_run(out)
    assert row.status == "completed" and row.verdict == "LEARNED NOTHING" and "Learned nothing" in row.problem
    assert "LEARNED NOTHING" in runs.runs(tmp_path).format()
    # The notebook view: the end line and the chart's title
    shown = io.StringIO()
    view = NotebookProgress(stream=shown, display=lambda *a, **k: SimpleNamespace(update=lambda *_: None),
                            make_bar=lambda **k: tqdm(file=io.StringIO(), **k), save_chart=False)
    view.replay(_events(out))
    assert "verdict: Learned nothing: eval_accuracy 0.5" in shown.getvalue()
    history = RunHistory()
    for event in _events(out):
        history.add(event)
    assert "LEARNED NOTHING" in _chart_title(history)


def test_a_classifier_that_predicts_the_majority_class_learned_nothing(tiny_bert, tmp_path):
    """80/20 labels and a rate too low to move the new head: every evaluation is 'always positive'."""
    rows, held_out = make_rows(200, 3), make_rows(100, 4)
    pick = lambda rs, pos, neg: ([r for r in rs if r["label"] == "positive"][:pos]  # noqa: E731
                                 + [r for r in rs if r["label"] == "negative"][:neg])
    data = DatasetDict(train=Dataset.from_list(pick(rows, 80, 20)), validation=Dataset.from_list(pick(held_out, 40, 10)))
    out = tmp_path / "majority"
    result = fit(str(tiny_bert), data, output_dir=str(out), learning_rate=1e-3, max_steps=12, eval_every=6,
                 **CLASSIFIER)
    assert result.metrics["eval_accuracy"] == pytest.approx(0.8) and result.metrics["eval_f1"] == pytest.approx(4 / 9)
    verdict = result.verdict  # judged on accuracy (the default best_metric): the majority class is the bar
    assert verdict["outcome"] == "no_better" and verdict["metric"] == "eval_accuracy"
    assert verdict["baseline"] == "the majority class" and "80% of the training labels" in verdict["baseline_detail"]
    assert not (out / "best").exists()


def _wrong_answers(n_train: int, n_eval: int, seed: int) -> DatasetDict:
    """Chats whose training answers are all "Nobody knows." while validation keeps the true ones."""
    wrong = [{"messages": [row["messages"][0], {"role": "assistant", "content": "Nobody knows."}]}
             for row in make_chat_rows(n_train, seed)]
    return DatasetDict(train=Dataset.from_list(wrong), validation=Dataset.from_list(make_chat_rows(n_eval, seed + 1)))


def test_a_lora_run_that_made_the_model_worse_says_so_and_keeps_no_best(trained_tiny_llama, tmp_path):
    """LoRA on the trained tiny Llama, taught a wrong answer: eval loss on the true answers 1.41
    (base) -> 2.19 on an AMD EPYC, 1.82 -> 2.07 on an Intel AMX Xeon (the trained base itself
    differs by CPU), while the training loss falls, so the run completes. Either is worse by
    more than 25 times the verdict's margin (~0.01). Worse by what it learns, not by a borderline rate: a LoRA run at 0.01 on the
    true answers was worse on an AMD EPYC and better on an Intel AMX CPU."""
    out = tmp_path / "worse"
    result = fit(str(trained_tiny_llama), _wrong_answers(48, 16, seed=7), output_dir=str(out), task="causal_lm",
                 learning_rate=1e-2, max_steps=8, eval_every=4, eval_before_training=True, lora_r=4, lora_alpha=8,
                 **{**CLASSIFIER, "max_length": 160})
    verdict = result.verdict
    assert result.status == "completed" and verdict["outcome"] == "worse", verdict
    assert verdict["baseline"] == "the base model" and verdict["value"] > verdict["baseline_value"] + 0.1
    assert verdict["text"].startswith("Worse than its baseline: eval_loss")
    assert not (out / "best").exists()  # every evaluation was worse than the base model
    assert any("What to try: a lower learning_rate" in w for w in _messages(out, "warn"))
    assert runs.read_run(out).verdict == "WORSE THAN BASELINE"


def test_a_run_that_learned_is_said_to_have_learned(trained_tiny_bert, tmp_path):
    out = tmp_path / "learned"
    result = fit(str(trained_tiny_bert), make_dataset(96, 32, seed=6), output_dir=str(out), learning_rate=2e-3,
                 max_steps=4, **CLASSIFIER)
    # How far above chance depends on the CPU's rounding (1 on an AMD EPYC, 0.9688 on an Intel
    # AMX Xeon): what must hold is a clear "learned" with the figure and chance named.
    assert result.learned is True, result.verdict
    accuracy = result.verdict["value"]
    assert accuracy >= 0.9 and result.verdict["text"].startswith(
        f"Learned: eval_accuracy {accuracy:.4g} against 0.5 for chance"), result.verdict
    assert (out / "best").is_dir() and result.verdict["best_step"] == 4
    assert _messages(out, "warn") == [] and runs.read_run(out).verdict == "learned"
