"""A run's verdict: did it learn anything? Its evaluation against a model that learned nothing.

A run can end ``completed`` with finite weights and still be worthless: a classifier whose
loss sits at ln 2 with accuracy 0.5, one that predicts only the majority class of 80/20
data (accuracy 0.80, macro-F1 0.44 at every evaluation), a LoRA run that made the base model
worse. The verdict compares the run's evaluation on its selection metric (``best_metric``)
with a baseline:

- a classifier: the better, on that metric, of *chance* (a uniform guess) and the *majority
  class* of the training labels, both scored on the validation rows by the task
  (``Task.baselines``: ``tasks/metrics.py``'s ``trivial_baselines``);
- a tagger (token classification): the better of chance (loss ln of the number of tags) and
  tagging every word O (entity F1 0; word accuracy the share of O);
- an extractive QA model: answering nothing (exact match and F1 0 on SQuAD 1.1-style data,
  the share of unanswerable questions on 2.0-style data);
- a preference-tuned model: chance, a coin flip between the answers (reward accuracy 0.5,
  DPO's loss ln 2);
- a language model: the base model's evaluation when it is known (the step-0 evaluation,
  ``eval_before_training=True``), else the run's first evaluation.

Outcomes: ``better`` (beyond the margin), ``no_better`` (within it), ``worse`` (below it),
``unknown`` (no baseline: a language model with one evaluation and no step-0 one).

The margin is what noise alone can give. A share (accuracy, F1, exact match) on n rows
varies by sqrt(p (1 - p) / n) around its true value p: ``better`` means at least two such
standard errors above the baseline (on 64 rows at p = 0.5: 0.125; on 1,000: 0.032), and
at least 0.01. A loss is averaged over many tokens or rows: 0.5% of the baseline's loss
(at least 0.005) is the margin.

What it decides: an evaluation is kept as ``best/`` only when it is ``better`` than the
classifier's baselines or than the base model (when the base model's evaluation is known;
with only the run's first evaluation as a baseline, every evaluation competes as before).
At the end, the final evaluation's verdict goes into the run record (``run.json``, before
``model/`` and its model card are written), the ``end`` event (``verdict``), the result
(``FitResult.verdict``), the runs table (its ``verdict`` column) and the views.

Stop early, or warn? Warn, at the end, every time, never silently; do not stop. An
evaluation at the baseline mid-run is not a ruined run: classifiers often sit at chance for
the first hundreds of steps before they learn (the tiny BERT of the tests: at ln 2 for 55
steps, then to 0.03), and stopping would cut short the runs that were about to work. A run
that actively gets worse is stopped by the divergence guard (``divergence.py``); one that
only fails to learn costs its compute, is reported as such, and never writes ``best/``.
"""

from __future__ import annotations

import math
from typing import Any

OUTCOMES = ("better", "no_better", "worse", "unknown")
SHARES = ("accuracy", "f1", "exact_match", "reward_accuracy")  # metrics that are fractions of rows
STANDARD_ERRORS = 2.0
MIN_SHARE_MARGIN = 0.01
LOSS_MARGIN = 0.005  # relative to the baseline's loss; at least this many nats


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def margin(metric: str, reference: float, rows: int | None) -> float:
    """How far beyond ``reference`` a value must be to count as better than it (see the docstring)."""
    if metric.removeprefix("eval_") in SHARES:
        if not rows:
            return 2 * MIN_SHARE_MARGIN
        p = min(max(reference, 0.0), 1.0)
        return max(MIN_SHARE_MARGIN, STANDARD_ERRORS * math.sqrt(p * (1 - p) / rows))
    return max(LOSS_MARGIN, LOSS_MARGIN * abs(reference))


def reference(metric: str, state: Any, *, for_best: bool) -> dict | None:
    """The baseline ``{"name", "detail", "value", "rows"}`` that ``metric`` is judged against, or None.

    ``state``: the run's TrainState (``baselines``, ``base_metrics``, ``first_metrics``).
    ``for_best``: for choosing ``best/``, the run's own first evaluation is no baseline.
    """
    lower_is_better = metric == "eval_loss"
    task_baselines = [b for b in (state.baselines or {}).get("baselines") or []
                      if _is_number(b.get("metrics", {}).get(metric))]
    if task_baselines:  # the better of them on this metric; on a tie the first (chance)
        chosen = (min if lower_is_better else max)(task_baselines, key=lambda b: b["metrics"][metric])
        return {"name": chosen["name"], "detail": chosen.get("detail"), "value": chosen["metrics"][metric],
                "rows": state.baselines.get("rows")}
    if state.base_metrics and _is_number(state.base_metrics.get(metric)):
        return {"name": "the base model", "detail": "its step-0 evaluation", "value": state.base_metrics[metric],
                "rows": None, "step": state.base_metrics.get("step")}
    if not for_best and state.first_metrics and _is_number(state.first_metrics.get(metric)):
        step = state.first_metrics.get("step")
        return {"name": "the run's first evaluation", "detail": f"step {step}", "value": state.first_metrics[metric],
                "rows": None, "step": step}
    return None


def judge(metric: str, value: float | None, baseline: dict | None) -> str:
    """``better`` | ``no_better`` | ``worse`` | ``unknown`` for one value of ``metric``."""
    if baseline is None or not _is_number(value):
        return "unknown"
    lower_is_better = metric == "eval_loss"
    gain = (baseline["value"] - value) if lower_is_better else (value - baseline["value"])
    room = margin(metric, baseline["value"], baseline.get("rows"))
    if gain > room:
        return "better"
    return "worse" if gain < -room else "no_better"


def final_verdict(metric: str, state: Any, *, best_written: bool) -> dict[str, Any]:
    """The ``verdict`` of the ``end`` event: the final evaluation (``state.metrics``) against its baseline.

    Fields: ``outcome``, ``metric``, ``value``, ``step``, ``baseline`` (its name),
    ``baseline_detail``, ``baseline_value``, ``margin``, ``best_step`` (the step ``best/`` holds, None when it was
    not written) and ``text``, one sentence for people.
    """
    value = state.metrics.get(metric)
    step = state.step
    baseline = reference(metric, state, for_best=False)
    if baseline is not None and baseline.get("step") == step and baseline["name"] != "the base model":
        baseline = None  # the final evaluation is the first one: nothing to compare it with
    outcome = judge(metric, value, baseline)
    verdict = {"outcome": outcome, "metric": metric, "value": value, "step": step,
               "baseline": baseline["name"] if baseline else None,
               "baseline_detail": baseline.get("detail") if baseline else None,
               "baseline_value": baseline["value"] if baseline else None,
               "margin": margin(metric, baseline["value"], baseline.get("rows")) if baseline else None,
               "best_step": state.best_step if best_written else None}
    verdict["text"] = describe(verdict)
    return verdict


def describe(verdict: dict[str, Any]) -> str:
    """One sentence for the end of the run, the views and a model card."""
    metric, outcome = verdict["metric"], verdict["outcome"]
    if outcome == "unknown":
        if not _is_number(verdict.get("value")):
            return f"No verdict: the run has no final {metric} to judge."
        return (f"No verdict: {metric} {verdict['value']:.4g} has no baseline to be compared with (only one "
                "evaluation); set eval_before_training=True to measure the base model first.")
    detail = f"{verdict['baseline_detail']}; " if verdict.get("baseline_detail") else ""
    shown = (f"{metric} {verdict['value']:.4g} against {verdict['baseline_value']:.4g} for {verdict['baseline']} "
             f"({detail}margin {verdict['margin']:.3g})")
    best = verdict.get("best_step")
    if outcome == "better":
        return f"Learned: {shown}."
    if best is not None:
        kept = f" best/ holds the evaluation of step {best}, which was better."
    else:
        kept = " best/ was not written: no evaluation beat the baseline."
    if outcome == "worse":
        return f"Worse than its baseline: {shown}. The final model (model/) is worse than that;{kept}"
    return f"Learned nothing: {shown}. The final model (model/) is no better than that;{kept}"
