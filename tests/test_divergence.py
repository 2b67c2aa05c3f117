"""The divergence guard (engine/divergence.py) on real runs: healthy ones are never stopped, ruined ones are.

Healthy: a fresh classifier; a fine-tuned one continued on a shifted domain and on 30%-noisy
labels (each with an easy first batch, loss ~0.03, that the old rule took for the start);
noisy labels from scratch; batch size 1; warm-up to a high but workable rate; 20 labels;
a LoRA run shorter than the guard's window. Ruined: a classifier at learning rate 1, a LoRA
run at 1 (rates far past the edge, so the outcome holds on any CPU's rounding). Every run is
tiny (tiny BERT / tiny Llama, at most 100 steps; ~25 s of CPU for the set). Each prints its figures (``-s``): peak loss against the bound, steps, verdict.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
from datasets import Dataset, DatasetDict

from workbench.engine.divergence import DivergenceGuard, floor_for, threshold, window_for
from workbench.engine.train import fit
from workbench.errors import TrainingError
from workbench.sources.synthetic import FILLER, NEGATIVE, NEUTRAL, POSITIVE, make_dataset, make_rows
from workbench.sources.synthetic_llm import make_chat_dataset

CLASSIFIER = dict(learning_rate=2e-3, batch_size=8, max_length=64, num_workers=0, log_every=1, warmup_ratio=0.0,
                  precision="fp32")  # fp32 pinned: the figures must not move with what "auto" picks
LORA = dict(task="causal_lm", learning_rate=3e-3, batch_size=8, max_length=160, num_workers=0, log_every=1,
            warmup_ratio=0.0, precision="fp32", lora_r=4, lora_alpha=8)


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # tiny models: a second thread buys little and costs a shared CI core


# ------------------------------------------------------------------------------ data
def _flip(rows: list[dict], share: float, seed: int) -> list[dict]:
    """``share`` of the labels flipped at random: label noise."""
    rng = random.Random(seed)
    other = {"positive": "negative", "negative": "positive"}
    return [{**r, "label": other[r["label"]]} if rng.random() < share else r for r in rows]


def _noisy(train_rows: int = 320) -> DatasetDict:
    # Noise seed 0: the first batch of the run holds no flipped label (its loss is ~0.03).
    return DatasetDict(train=Dataset.from_list(_flip(make_rows(train_rows, 11), 0.3, 0)),
                       validation=Dataset.from_list(_flip(make_rows(200, 12), 0.3, 99)))


def _turned(n: int, seed: int) -> list[dict]:
    """A new domain: two clauses of one polarity, then "but" and the verdict, of the other."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = ("negative", "positive")[i % 2]
        own, other = (POSITIVE, NEGATIVE) if label == "positive" else (NEGATIVE, POSITIVE)
        clauses = [f"{rng.choice(NEUTRAL)} is {rng.choice(FILLER)} {rng.choice(other)}" for _ in range(2)]
        clauses.append(f"but {rng.choice(NEUTRAL)} is {rng.choice(own)}")
        rows.append({"text": ", ".join(clauses).capitalize() + ".", "label": label})
    return rows


def _shifted() -> DatasetDict:
    """Half the known domain, half the new one (on which the trained model is confidently wrong)."""
    return DatasetDict(train=Dataset.from_list(make_rows(160, 13) + _turned(160, 14)),
                       validation=Dataset.from_list(make_rows(32, 15) + _turned(32, 16)))


def _twenty_labels() -> DatasetDict:
    words = (POSITIVE + NEGATIVE)[:20]

    def rows(n, seed):
        rng = random.Random(seed)
        return [{"text": ", ".join(f"{rng.choice(NEUTRAL)} is {rng.choice(FILLER)} {words[i % 20]}"
                                   for _ in range(rng.randint(1, 2))).capitalize() + ".",
                 "label": f"class-{i % 20:02d}"} for i in range(n)]

    return DatasetDict(train=Dataset.from_list(rows(400, 1)), validation=Dataset.from_list(rows(100, 2)))


# ------------------------------------------------------------------------- the runs
def _figures(out: Path) -> dict:
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    start = next(e for e in events if e["kind"] == "start")
    losses = [(e["step"], e["loss"]) for e in events if e["kind"] == "train"]
    peak_step, peak = max(losses, key=lambda pair: pair[1])
    end = events[-1]
    num_classes = len(start.get("label_names") or []) or 49152
    return {"status": end.get("status"), "steps": end.get("step"), "peak": peak, "peak_step": peak_step,
            "old_rule_stops_at": _old_rule_stop([loss for _, loss in losses], num_classes, start["total_steps"]),
            "first_loss": losses[0][1], "start": start["divergence"]["start"], "bound": start["divergence"]["bound"],
            "window": start["divergence"]["window"], "verdict": (end.get("verdict") or {}).get("outcome"),
            "metrics": end.get("metrics")}


def _old_rule_stop(losses: list[float], num_classes: int, total_steps: int) -> int | None:
    """Where the rule before issue 27 stopped a run: bound max(first + max(0.5, first / 2), 0.85 ln C)
    from the first batch's loss, 3/4 of a window of clamp(total / 10, 4, 20) steps above it."""
    bound = max(losses[0] + max(0.5, losses[0] / 2), 0.85 * math.log(num_classes))
    window = min(20, max(4, total_steps // 10))
    for end in range(window, len(losses) + 1):
        if sum(loss >= bound for loss in losses[end - window:end]) >= math.ceil(0.75 * window):
            return end
    return None


def _say(name: str, f: dict) -> None:
    n = lambda value: "?" if value is None else f"{value:.3f}"  # noqa: E731 — a start that was not measured
    print(f"\nFIGURES {name}: {f['status']} after {f['steps']} steps; peak loss {f['peak']:.3f} (step "
          f"{f['peak_step']}) vs bound {n(f['bound'])} (start {n(f['start'])}, window {f['window']}); first batch "
          f"{f['first_loss']:.3f}; the old rule stops it at step {f['old_rule_stops_at']}; verdict {f['verdict']}; "
          f"{f['metrics']}")


def _healthy(name: str, model, data, tmp_path, **settings) -> dict:
    out = tmp_path / name
    result = fit(str(model), data, output_dir=str(out), **settings)
    figures = _figures(out)
    _say(name, figures)
    assert result.status == "completed" and result.model_dir.is_dir()
    return figures


def test_a_fresh_classifier(tiny_bert, tmp_path):
    f = _healthy("fresh", tiny_bert, make_dataset(320, 64, seed=5), tmp_path, max_steps=120, **{
        **CLASSIFIER, "warmup_ratio": 0.1})
    assert f["verdict"] == "better" and f["start"] == pytest.approx(math.log(2), abs=0.02)


def test_a_classifier_continued_on_a_shifted_domain(trained_tiny_bert, tmp_path):
    f = _healthy("continued-shifted", trained_tiny_bert, _shifted(), tmp_path, max_steps=60, seed=1, **CLASSIFIER)
    # An easy first batch, far below the data's loss: the old rule's bound from it was 0.59.
    assert f["first_loss"] < 0.1 < 1.0 < f["start"]
    assert f["verdict"] == "better"


def test_a_classifier_continued_on_noisy_labels(trained_tiny_bert, tmp_path):
    f = _healthy("continued-noisy", trained_tiny_bert, _noisy(), tmp_path, max_steps=40, **CLASSIFIER)
    assert f["first_loss"] < 0.1 < 1.0 < f["start"]
    assert f["verdict"] == "better"  # ~0.68 against the noise ceiling 0.70, majority 0.5


def test_noisy_labels_from_scratch(tiny_bert, tmp_path):
    _healthy("fresh-noisy", tiny_bert, _noisy(), tmp_path, max_steps=40, **CLASSIFIER)


def test_batch_size_one(trained_tiny_bert, tmp_path):
    """One row a step, 30% of them with the wrong label: single steps at ~4 against a bound of ~2.3."""
    f = _healthy("batch-size-1", trained_tiny_bert, _noisy(), tmp_path, max_steps=60, **{**CLASSIFIER, "batch_size": 1})
    assert f["window"] == 20 and f["peak"] > f["bound"]  # lone rows above the bound never stop a run


def test_warm_up_to_a_high_but_workable_rate(tiny_bert, tmp_path):
    f = _healthy("warm-up-high-rate", tiny_bert, make_dataset(320, 64, seed=5), tmp_path, max_steps=100,
                 **{**CLASSIFIER, "learning_rate": 1e-2, "warmup_ratio": 0.3})
    assert f["verdict"] == "better"


def test_twenty_labels(trained_tiny_bert, tmp_path):
    f = _healthy("twenty-labels", trained_tiny_bert, _twenty_labels(), tmp_path, max_steps=40,
                 **{**CLASSIFIER, "learning_rate": 5e-3, "warmup_ratio": 0.1})
    assert f["start"] == pytest.approx(math.log(20), abs=0.2)


def test_lora_shorter_than_the_window(trained_tiny_llama, tmp_path):
    f = _healthy("lora-3-steps", trained_tiny_llama, make_chat_dataset(48, 16, seed=7), tmp_path, max_steps=3,
                 eval_before_training=True, **LORA)
    assert f["steps"] == 3 < f["window"]


def _ruined(name: str, model, data, tmp_path, **settings) -> tuple[dict, TrainingError]:
    out = tmp_path / name
    with pytest.raises(TrainingError) as err:
        fit(str(model), data, output_dir=str(out), **settings)
    figures = _figures(out)
    _say(name, figures)
    assert figures["status"] == "failed" and "The loss diverged" in str(err.value)
    assert not (out / "model").exists() and not (out / "best").exists()
    return figures, err.value


def test_a_classifier_at_learning_rate_1_is_stopped(tiny_bert, tmp_path):
    f, err = _ruined("classifier-rate-1", tiny_bert, make_dataset(96, 32, seed=5), tmp_path, max_steps=12,
                     **{**CLASSIFIER, "learning_rate": 1.0})
    assert f["steps"] <= 6 and "try the default, 2e-05" in str(err)


@pytest.fixture(scope="module")
def well_trained_tiny_llama(tiny_llama_dir, tmp_path_factory) -> Path:
    """The tiny Llama after 96 full fine-tuning steps (eval loss ~0.45, ~10 s): a model with much to lose.

    trained_tiny_llama (24 steps, training loss ~1.9) is too close to what a ruined LoRA run
    collapses to: after the first huge steps such a run settles at ~2.1-2.6, a model that has
    forgotten the chats but kept the tokens' frequencies, under a bound of ~2.8. Whether it
    got there within the guard's window depended on the CPU's rounding and the thread count
    (rate 1 stopped on an Intel AMX CPU with 2 threads and learned nothing on CI's runner).
    From ~0.48 the bound is ~0.97 and the collapsed state itself is twice past it."""
    out = tmp_path_factory.mktemp("well-trained-llama") / "run"
    result = fit(str(tiny_llama_dir), make_chat_dataset(64, 8), output_dir=str(out), task="causal_lm",
                 finetune="full", learning_rate=2e-2, batch_size=8, max_length=160, num_workers=0,
                 max_steps=96, warmup_ratio=0.1, precision="fp32")
    assert result.metrics["eval_loss"] < 0.8, result.metrics
    return result.model_dir


def test_lora_at_rate_1_is_stopped(well_trained_tiny_llama, tmp_path):
    """Ruined by arithmetic, not by rounding: Adam's first step moves every LoRA B entry by about
    the rate whatever the gradient's size, so at 1.0 each adapted weight gains a product of
    entries of +-1 (x alpha/r = 2), far larger than the weights themselves. The losses then sit
    at 4-30 and never below ~2.1 (the collapsed state), against a bound of ~0.97: stopped at the
    fourth step in 24 of 24 runs here (data seeds 0-11, one and two threads)."""
    f, err = _ruined("lora-rate-1", well_trained_tiny_llama, make_chat_dataset(48, 16, seed=7), tmp_path,
                     max_steps=12, **{**LORA, "learning_rate": 1.0, "lora_r": 16, "lora_alpha": 32})
    assert f["steps"] <= 8 and f["peak"] > 2 * f["bound"]
    assert "try the default, 0.0002" in str(err)


# ---------------------------------------------------------------------- the rule itself
def test_the_bound_is_far_above_a_robust_start_and_never_below_a_guess_for_classifiers():
    assert floor_for(2, language_model=False) == pytest.approx(math.log(2))
    assert floor_for(49152, language_model=True) == 0.0
    assert threshold(0.693, math.log(2)) == pytest.approx(1.193)  # a new binary head
    assert threshold(0.01, math.log(2)) == pytest.approx(math.log(2))  # a near-perfect start: the guess's loss
    assert threshold(2.0) == pytest.approx(3.0)  # a pretrained language model
    assert window_for(40, rows_per_step=8) == 4 and window_for(400, rows_per_step=8) == 20
    assert window_for(40, rows_per_step=1) == 20  # one row a step: 20 rows before a verdict


def test_a_sustained_window_diverges_lone_spikes_do_not():
    guard = DivergenceGuard(num_classes=49152, total_steps=40, rows_per_step=8, language_model=True, start=2.0)
    for step, loss in enumerate([2.0, 2.1, 30.0, 1.9, 1.8, 11.0, 1.7, 1.6], start=1):  # two lone spikes
        guard.observe(step, loss)
        assert guard.diverged() is None and guard.diverged(partial=True) is None
    for step, loss in enumerate([4.8, 5.1, 4.9], start=9):
        guard.observe(step, loss)
    assert guard.diverged() == (9, 11, 4.9)  # 3 of the last 4 steps past 3.0
    assert "bound 3.00" in guard.describe()


def test_a_run_shorter_than_the_window_is_judged_before_it_is_saved():
    guard = DivergenceGuard(num_classes=2, total_steps=3, rows_per_step=8, start=0.69)
    for step, loss in enumerate([2.0, 5.0, 6.0], start=1):
        guard.observe(step, loss)
    assert guard.diverged() is None and guard.diverged(partial=True) == (1, 3, 5.0)
