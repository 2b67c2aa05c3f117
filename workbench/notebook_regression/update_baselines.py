"""``--update-baselines``: write a run's values into the baselines file for review.

Only the ``value:`` of changed entries is edited in place, so comments stay and
the diff a maintainer reviews shows just the numbers.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from workbench.notebook_regression.checks import is_number

if TYPE_CHECKING:  # report imports baselines; at run time only the report's data is read
    from workbench.notebook_regression.report import RegressReport

_KEY_LINE = re.compile(
    r"""^(?P<indent>\s*)(?P<q>["']?)(?P<key>[^"'#\s][^"'#]*?)(?P=q):(?:\s+|$)(?P<rest>.*)$"""
)
_FLOW_VALUE = re.compile(r"(\bvalue:\s*)([^,}]+?)(\s*[,}])")


def write_updated_baselines(report: RegressReport, path: str | Path) -> list[str]:
    """Set each existing baseline's value to this run's; keep direction and tolerance.

    Notebooks that failed are left alone, and new records are not added (their
    direction and tolerance need a person): the report lists them as "no baseline".
    Returns one line per change.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    data = yaml.safe_load(text) or {}
    section = data.get(report.profile) or {}
    new_values: dict[tuple[str, str], Any] = {}
    changes = []
    for result in report.results:
        if result.status == "failed":
            continue
        for name, entry in (section.get(result.notebook) or {}).items():
            if name not in result.records:
                continue
            new = _rounded(result.records[name])
            numeric = is_number(new) and math.isfinite(new)
            if entry.get("direction", "higher") != "equal" and not numeric:
                continue  # never write a non-number where a number is compared
            if new != entry.get("value"):
                changes.append(f"{result.notebook}: {name} {entry.get('value')!r} -> {new!r}")
                entry["value"] = new
                new_values[(result.notebook, name)] = new
    edited = _edit_values(text, report.profile, new_values)
    if yaml.safe_load(edited or "{}") != data:
        # A layout the line editor does not follow: write the data itself (comments lost).
        edited = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)
    path.write_text(edited, encoding="utf-8")
    return changes


def _edit_values(text: str, profile: str, new_values: Mapping[tuple[str, str], Any]) -> str:
    """``text`` with ``profile.notebook.metric.value`` replaced for each entry of new_values."""
    lines = text.splitlines(keepends=True)
    stack: list[tuple[int, str]] = []  # (indent, key) of the mapping keys above this line
    for i, line in enumerate(lines):
        match = _KEY_LINE.match(line)
        if not match or line.lstrip().startswith("#"):
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match["key"].strip()))
        keys = [key for _, key in stack]
        if keys[0] != profile:
            continue
        if len(keys) == 3 and tuple(keys[1:]) in new_values and match["rest"].startswith("{"):
            new = json.dumps(new_values[tuple(keys[1:])])  # JSON scalars are YAML scalars
            lines[i] = _FLOW_VALUE.sub(lambda m, new=new: m[1] + new + m[3], line, count=1)
        elif len(keys) == 4 and keys[3] == "value" and tuple(keys[1:3]) in new_values:
            new = json.dumps(new_values[tuple(keys[1:3])])
            comment = line[line.index("#") :].rstrip("\n") if "#" in match["rest"] else ""
            end = "\n" if line.endswith("\n") else ""
            lines[i] = f"{match['indent']}value: {new}{'  ' + comment if comment else ''}{end}"
    return "".join(lines)


def _rounded(value: Any) -> Any:
    """Six significant digits: a baseline is a reference, not a bit-exact float."""
    return float(f"{value:.6g}") if isinstance(value, float) else value
