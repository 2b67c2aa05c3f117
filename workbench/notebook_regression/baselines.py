"""Baselines (``baselines.yaml`` beside this module) and the verdict for each recorded metric.

A baseline is the accepted value of a metric, the direction that counts as
better and how far a new value may move the wrong way before CI fails.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.errors import RegressionError
from workbench.notebook_regression.checks import is_number, load_yaml, non_negative

DIRECTIONS = ("higher", "lower", "equal")
FAILING_VERDICTS = ("regressed", "missing", "invalid")


@dataclass
class Baseline:
    """The accepted value of a metric and how far a new value may move the wrong way."""

    value: Any
    direction: str = "higher"  # higher | lower (is better), or equal (must match)
    tolerance: float = 0.0  # absolute
    relative_tolerance: float = 0.0  # fraction of |value|; the looser of the two applies

    def allowed(self) -> float:
        scale = abs(self.value) if is_number(self.value) else 0.0
        return max(self.tolerance, self.relative_tolerance * scale)


def load_baselines(path: str | Path, profile: str) -> dict[str, dict[str, Baseline]]:
    """notebook -> metric -> Baseline for one profile; {} when the file or section is absent."""
    path = Path(path)
    if not path.exists():
        return {}
    data = load_yaml(path, "regression baselines") or {}
    section = data.get(profile) or {}
    result: dict[str, dict[str, Baseline]] = {}
    for notebook, metrics in section.items():
        result[str(notebook)] = {}
        for name, entry in (metrics or {}).items():
            where = f"{path}: {profile}.{notebook}.{name}"
            if not isinstance(entry, dict) or "value" not in entry:
                raise RegressionError(
                    f"{where} must be a mapping with a `value`.",
                    "Write `{value: 0.9, direction: higher, tolerance: 0.05}`.",
                )
            unknown = sorted(set(entry) - {"value", "direction", "tolerance", "relative_tolerance"})
            direction = entry.get("direction", "higher")
            if unknown or direction not in DIRECTIONS:
                raise RegressionError(
                    f"{where} has unknown key(s) {unknown} or direction {direction!r}.",
                    "Keys: value, direction (higher|lower|equal), tolerance, relative_tolerance.",
                )
            if direction != "equal" and not is_number(entry["value"]):
                raise RegressionError(
                    f"{where}: value {entry['value']!r} is not a number, but direction is {direction}.",
                    "Use a number, or `direction: equal` for strings and bools.",
                )
            result[str(notebook)][str(name)] = Baseline(
                value=entry["value"],
                direction=direction,
                tolerance=non_negative(entry.get("tolerance", 0.0), f"{where}.tolerance"),
                relative_tolerance=non_negative(
                    entry.get("relative_tolerance", 0.0), f"{where}.relative_tolerance"
                ),
            )
    return result


@dataclass
class MetricResult:
    name: str
    value: Any
    baseline: Baseline | None
    verdict: str  # pass | improved | regressed | missing | invalid | no baseline
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.verdict in FAILING_VERDICTS


def compare_metric(
    name: str, value: Any, baseline: Baseline, recorded: bool = True
) -> MetricResult:
    """The verdict for one recorded value against its baseline."""
    if not recorded:
        return MetricResult(
            name,
            None,
            baseline,
            "missing",
            f'the notebook did not record it; call workbench.record("{name}", value)',
        )
    if baseline.direction == "equal":
        if is_number(value) and is_number(baseline.value):
            same = abs(value - baseline.value) <= baseline.allowed()
        else:
            same = value == baseline.value
        verdict = "pass" if same else "regressed"
        return MetricResult(
            name, value, baseline, verdict, "" if same else "differs from the baseline"
        )
    if not is_number(value) or not math.isfinite(value):
        return MetricResult(
            name,
            value,
            baseline,
            "invalid",
            f"recorded {json.dumps(value, default=str)}, not a finite number "
            "(record() stores NaN and infinity as null)",
        )
    gain = value - baseline.value if baseline.direction == "higher" else baseline.value - value
    allowed = baseline.allowed()
    if gain < -allowed:
        worse = "lower" if baseline.direction == "higher" else "higher"
        return MetricResult(
            name,
            value,
            baseline,
            "regressed",
            f"{abs(gain):.4g} {worse} than the baseline (tolerance {allowed:.4g})",
        )
    if gain > allowed:
        return MetricResult(
            name,
            value,
            baseline,
            "improved",
            "better than the baseline beyond its tolerance; consider --update-baselines",
        )
    return MetricResult(name, value, baseline, "pass")


def compare_metrics(
    records: Mapping[str, Any], baselines: Mapping[str, Baseline]
) -> list[MetricResult]:
    """Every baseline's verdict, then the records that have no baseline (informational)."""
    results = [
        compare_metric(name, records.get(name), baseline, name in records)
        for name, baseline in baselines.items()
    ]
    results += [
        MetricResult(name, value, None, "no baseline")
        for name, value in records.items()
        if name not in baselines
    ]
    return results
