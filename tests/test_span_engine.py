"""The engine's promises with the span tasks (a tiny BERT, a few steps): out-of-memory halving in
training and evaluation gives the same numbers, bf16 autocast on CPU, the divergence guard's
scale, and two torchrun processes that evaluate every question exactly once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from workbench.config import DatasetChoice, ModelChoice, RunSpec, TrainConfig
from workbench.engine import train
from workbench.frontend import fit
from workbench.tasks.question_answering import QuestionAnsweringTask
from workbench.tasks.token_classification import TokenClassificationTask


@pytest.fixture(autouse=True)
def _few_threads():
    torch.set_num_threads(2)


@pytest.fixture(scope="module")
def no_dropout_bert(tiny_span_bert, tmp_path_factory):
    """Dropout masks depend on the micro-batch's shape; without dropout halved steps must agree."""
    copy = tmp_path_factory.mktemp("models") / "no-dropout"
    shutil.copytree(tiny_span_bert, copy)
    config = json.loads((copy / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (copy / "config.json").write_text(json.dumps(config))
    return copy


def _quick(model, data, out, **settings):
    values = dict(output_dir=str(out), learning_rate=2e-3, batch_size=8, num_workers=0, progress="none",
                  max_length=64, max_steps=4, log_every=1, warmup_ratio=0.0)
    return fit(str(model), str(data), **{**values, **settings})


def _warnings(result):
    return [e["text"] for e in result.history if e["kind"] == "message" and e["level"] == "warn"]


def test_oom_halving_keeps_the_ner_loss_curve(no_dropout_bert, ner_folder, tmp_path, monkeypatch):
    """Micro-batches are weighted by their labelled tokens (units): halved steps give the same losses.
    In fp32: under bf16 autocast (auto on a CPU that computes it) other batch shapes round differently."""
    plain = _quick(no_dropout_bert, ner_folder, tmp_path / "plain", precision="fp32")
    original = train._optimizer_step

    def step_or_oom(run, batches, step):
        if step == 2 and run.state.micro_batch_size > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return original(run, batches, step)

    monkeypatch.setattr(train, "_optimizer_step", step_or_oom)
    halved = _quick(no_dropout_bert, ner_folder, tmp_path / "oom", precision="fp32")
    assert [e["micro_batch_size"] for e in halved.history if e["kind"] == "train"] == [8, 2, 2, 2]
    losses = [[e["loss"] for e in r.history if e["kind"] == "train"] for r in (plain, halved)]
    assert losses[1] == pytest.approx(losses[0], abs=1e-5)
    assert halved.metrics == pytest.approx(plain.metrics, abs=1e-5)


def test_oom_in_qa_evaluation_halves_and_scores_the_same(tiny_span_bert, qa_folder, tmp_path, monkeypatch):
    plain = _quick(tiny_span_bert, qa_folder, tmp_path / "plain", max_steps=2, doc_stride=16)
    original = QuestionAnsweringTask.eval_outputs

    def eval_outputs_or_oom(self, model, batch):
        if len(batch["input_ids"]) > 4:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated in evaluation)")
        return original(self, model, batch)

    monkeypatch.setattr(QuestionAnsweringTask, "eval_outputs", eval_outputs_or_oom)
    retried = _quick(tiny_span_bert, qa_folder, tmp_path / "oom", max_steps=2, doc_stride=16)
    assert any("eval batches of 4" in w for w in _warnings(retried))
    assert retried.metrics == pytest.approx(plain.metrics, abs=1e-6)
    assert (retried.model_dir / "eval_predictions.jsonl").read_text() == (
        plain.model_dir / "eval_predictions.jsonl").read_text()


def test_bf16_autocast_on_cpu(tiny_span_bert, ner_folder, tmp_path):
    result = _quick(tiny_span_bert, ner_folder, tmp_path / "run", precision="bf16", max_steps=2)
    start = next(e for e in result.history if e["kind"] == "start")
    assert start["precision"] == "bf16" and result.status == "completed"
    assert all(isinstance(v, (int, float)) and v == v for v in result.metrics.values())  # no NaN


def test_the_verdict_judges_span_tasks_against_a_model_that_learned_nothing(tiny_span_bert, ner_folder,
                                                                           qa_folder, tmp_path):
    """A tagger that tags every word O has entity F1 0: a run at that score learned nothing, says so and
    keeps no best/; a QA run is judged against answering nothing (0 on SQuAD 1.1-style data)."""
    ner = _quick(tiny_span_bert, ner_folder, tmp_path / "ner")  # 4 steps at 2e-3: collapses to O
    assert ner.metrics["eval_f1"] == 0.0 and ner.metrics["eval_accuracy"] > 0.5
    assert ner.verdict["outcome"] == "no_better" and ner.verdict["baseline"] == "tagging every word O"
    assert ner.verdict["baseline_value"] == 0.0 and ner.best_checkpoint is None
    assert "Learned nothing" in json.loads((tmp_path / "ner" / "run.json").read_text())["verdict"]["text"]
    qa = _quick(tiny_span_bert, qa_folder, tmp_path / "qa", max_steps=2, doc_stride=16)
    assert qa.verdict["baseline"] == "answering nothing" and qa.verdict["baseline_value"] == 0.0
    assert qa.verdict["metric"] == "eval_f1" and qa.verdict["outcome"] != "unknown"


def test_the_divergence_guard_knows_each_task_s_chance_level(tiny_span_bert, ner_folder, qa_folder):
    from transformers import AutoTokenizer

    from workbench.sources.data import load_splits

    tokenizer = AutoTokenizer.from_pretrained(tiny_span_bert)
    ner = TokenClassificationTask(TrainConfig(task="token_classification"))
    ner.check_data(load_splits(DatasetChoice(source="files", path=str(ner_folder))))
    assert ner.num_classes() == 9  # O and B-/I- of four types: ln 9 is a uniform guess
    qa = QuestionAnsweringTask(TrainConfig(task="question_answering", max_length=64))
    splits = load_splits(DatasetChoice(source="files", path=str(qa_folder)))
    train_windows, _ = qa.datasets(splits, tokenizer, 64)
    assert qa.num_classes() == sorted(train_windows.lengths)[len(train_windows) // 2]  # positions to choose from
    assert 20 < qa.num_classes() <= 64


def test_two_torchrun_processes_evaluate_every_question_once(tiny_span_bert, qa_folder, tmp_path):
    out = tmp_path / "run"
    spec = RunSpec(model=ModelChoice(str(tiny_span_bert)), data=DatasetChoice(source="files", path=str(qa_folder)),
                   train=TrainConfig(output_dir=str(out), learning_rate=2e-3, batch_size=4, max_steps=3,
                                     max_length=64, doc_stride=16, num_workers=0, log_every=1))
    config = spec.save(tmp_path / "run.yaml")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "workbench", "train", "--config", str(config), "--progress", "none"],
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    start = next(e for e in events if e["kind"] == "start")
    assert start["world_size"] == 2 and start["config"]["task"] == "question_answering"
    saved = [json.loads(line) for line in (out / "model" / "eval_predictions.jsonl").read_text().splitlines()]
    ids = [p["id"] for p in saved]
    assert len(ids) == len(set(ids)) == 36  # every question once: no window lost or doubled by the gather
    final = [e for e in events if e["kind"] == "eval"][-1]
    assert final["eval_exact_match"] == pytest.approx(sum(p["exact_match"] for p in saved) / 36)
