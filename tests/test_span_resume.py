"""kill -9 in the middle of a token-classification or question-answering run, then an exact resume.

As tests/test_train_resume.py does for classification: each run is a real subprocess; on CPU
with num_workers=0 the resumed run reproduces the uninterrupted run's losses (1e-6), its
final weights bit for bit, and its final evaluation (SQuAD 2.0 data here, so the "no answer"
path is part of it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from workbench.engine import checkpoint

WORKER = r'''
import os, sys, time
import torch
torch.set_num_threads(1)
import workbench.engine.events as events
from workbench.engine.train import fit

slow = float(os.environ.get("SLOW_STEP_S", "0"))
if slow:  # long enough to be killed part-way
    original = events.EventLog.write
    def write(self, kind, **fields):
        if kind == "train":
            time.sleep(slow)
        return original(self, kind, **fields)
    events.EventLog.write = write

model, data, out, task = sys.argv[1:5]
extra = dict(doc_stride=16) if task == "question_answering" else {}
result = fit(model, data, output_dir=out, learning_rate=2e-3, batch_size=8, max_steps=12, save_every=3,
             log_every=1, eval_every=6, keep_checkpoints=2, num_workers=0, warmup_ratio=0.1, max_length=64,
             **extra)
print("STATUS", result.status)
'''
STEPS = 12


@pytest.fixture(scope="module")
def span_data(tmp_path_factory):
    from workbench.sources.synthetic_spans import (
        make_ner_sentences,
        make_squad_articles,
        write_conll,
        write_squad,
    )

    base = tmp_path_factory.mktemp("span-data")
    write_conll(base / "ner" / "train.conll", make_ner_sentences(96, seed=3))
    write_conll(base / "ner" / "validation.conll", make_ner_sentences(16, seed=4))
    articles = dict(people_per_context=2, questions_per_context=2, unanswerable=1)
    write_squad(base / "qa" / "train.json", make_squad_articles(24, 3, **articles), version="v2.0")
    write_squad(base / "qa" / "validation.json", make_squad_articles(4, 4, **articles), version="v2.0")
    script = base / "worker.py"
    script.write_text(WORKER)
    return {"token_classification": base / "ner", "question_answering": base / "qa", "script": script}


def _run(span_data, task, model, out, env=None, wait=True):
    args = [sys.executable, str(span_data["script"]), str(model), str(span_data[task]), str(out), task]
    proc = subprocess.Popen(args, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if wait:
        output, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0 and "STATUS completed" in output, output[-3000:]
    return proc


def _events(out: Path, kind: str) -> list[dict]:
    lines = (out / "events.jsonl").read_text().splitlines() if (out / "events.jsonl").exists() else []
    return [e for e in map(json.loads, lines) if e["kind"] == kind]


@pytest.mark.slow  # 25-30 s per task on two quiet cores: three runs of a tiny BERT, each a new process
@pytest.mark.parametrize("task", ["token_classification", "question_answering"])
def test_kill_9_mid_run_then_resume_matches_the_uninterrupted_run(task, span_data, tiny_span_bert, tmp_path):
    reference = tmp_path / "uninterrupted"
    _run(span_data, task, tiny_span_bert, reference)
    assert _events(reference, "start")[0]["config"]["task"] == task  # picked from the files

    out = tmp_path / "killed"
    proc = _run(span_data, task, tiny_span_bert, out, env={"SLOW_STEP_S": "0.3"}, wait=False)
    deadline = time.time() + 300
    while len(_events(out, "train")) < 7:
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read()[-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    resumed_after = checkpoint.step_of(checkpoint.latest_checkpoint(out))
    assert 3 <= resumed_after < STEPS
    _run(span_data, task, tiny_span_bert, out)

    losses = {e["step"]: e["loss"] for e in _events(out, "train")}  # the resumed value of a step wins
    expected = {e["step"]: e["loss"] for e in _events(reference, "train")}
    assert sorted(losses) == list(range(1, STEPS + 1))
    for step in range(resumed_after + 1, STEPS + 1):
        assert losses[step] == pytest.approx(expected[step], abs=1e-6), step
    final, final_expected = _events(out, "eval")[-1], _events(reference, "eval")[-1]
    metrics = {k: v for k, v in final.items() if k.startswith("eval_")}
    assert metrics == pytest.approx({k: v for k, v in final_expected.items() if k.startswith("eval_")}, abs=1e-6)
    if task == "question_answering":
        assert "eval_no_answer_exact_match" in metrics  # SQuAD 2.0 scoring ran

    from safetensors.torch import load_file

    got, want = load_file(out / "model" / "model.safetensors"), load_file(reference / "model" / "model.safetensors")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    predictions = (out / "model" / "eval_predictions.jsonl").read_text()
    assert predictions == (reference / "model" / "eval_predictions.jsonl").read_text()
