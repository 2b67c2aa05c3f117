"""The doctor's findings and how they show: a text table for terminals, an HTML table in
notebooks (``workbench.doctor()`` as the last line of a cell), JSON for machines.

JSON written by ``workbench doctor --json`` (schema version 1)::

    {
      "version": 1,
      "ok": true,                       # false when any result has level "error"
      "counts": {"ok": 17, "warn": 2, "error": 0},
      "results": [
        {"section": "gpu",              # python | torch | gpu | system | storage |
                                        # huggingface | jupyter
         "name": "nvidia driver",       # the check, unique within the report
         "level": "warn",               # "ok" | "warn" | "error"
         "message": "no NVIDIA driver: ...",
         "fix": "..."}                  # "" when there is nothing to do
      ],
      "facts": {                        # what the checks were computed from
        "python": {...}, "packages": {...}, "torch": {...}, "nvml": {...},
        "gpus": [...], "shm": {...}, "cpu": {...}, "container": "...|null",
        "output_dir": {...}, "huggingface": {...}, "jupyter": {...}
      }
    }

Facts never hold a Jupyter token or password, only whether one is set.
"""

from __future__ import annotations

import html
import json
import shutil
import textwrap
from dataclasses import dataclass, field
from typing import Any

OK, WARN, ERROR = "ok", "warn", "error"
LEVELS = (OK, WARN, ERROR)
JSON_VERSION = 1


@dataclass
class CheckResult:
    """One finding. ``fix`` says what to do next; empty when nothing needs doing."""

    name: str
    level: str  # "ok" | "warn" | "error"
    message: str
    fix: str = ""
    section: str = ""

    def __post_init__(self):
        if self.level not in LEVELS:
            raise ValueError(f"level must be one of {LEVELS}, got {self.level!r}")


@dataclass
class DoctorReport:
    """The doctor's results; shows as an HTML table in a notebook, a text table in a terminal."""

    results: list[CheckResult]
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """False when any check failed at level "error"."""
        return not self.errors

    @property
    def errors(self) -> list[CheckResult]:
        return [r for r in self.results if r.level == ERROR]

    @property
    def warnings(self) -> list[CheckResult]:
        return [r for r in self.results if r.level == WARN]

    def __getitem__(self, name: str) -> CheckResult:
        for result in self.results:
            if result.name == name:
                return result
        raise KeyError(f"no check named {name!r}; have: {', '.join(r.name for r in self.results)}")

    def counts(self) -> dict[str, int]:
        return {level: sum(r.level == level for r in self.results) for level in LEVELS}

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": JSON_VERSION,
            "ok": self.ok,
            "counts": self.counts(),
            "results": [
                {k: getattr(r, k) for k in ("section", "name", "level", "message", "fix")}
                for r in self.results
            ],
            "facts": self.facts,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def summary(self) -> str:
        c = self.counts()
        verdict = "problems found" if c[ERROR] else ("usable, with warnings" if c[WARN] else "all good")
        return f"{c[ERROR]} error(s), {c[WARN]} warning(s), {c[OK]} ok: {verdict}"

    def to_text(self, width: int | None = None) -> str:
        width = width or max(80, min(shutil.get_terminal_size((100, 24)).columns, 140))
        name_w = max([len(r.name) for r in self.results] + [5])
        indent = 7 + name_w + 2
        text_w = max(30, width - indent)
        lines = [f"{'LEVEL':<7}{'CHECK':<{name_w}}  RESULT"]
        section = None
        for r in self.results:
            if r.section != section:
                section = r.section
                lines.append(f"-- {section} " + "-" * max(0, width - len(section) - 4))
            marker = {OK: "ok", WARN: "WARN", ERROR: "ERROR"}[r.level]
            # Paths, URLs and commands stay whole so they can be copied.
            wrap = dict(width=text_w, break_on_hyphens=False, break_long_words=False)
            body = textwrap.wrap(r.message, **wrap) or [""]
            if r.fix and r.level != OK:
                body += textwrap.wrap("fix: " + r.fix, subsequent_indent="     ", **wrap)
            lines.append(f"{marker:<7}{r.name:<{name_w}}  {body[0]}")
            lines.extend(" " * indent + line for line in body[1:])
        lines.append("")
        lines.append(self.summary())
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        c = self.counts()
        return f"<DoctorReport ok={c[OK]} warn={c[WARN]} error={c[ERROR]}>"

    def _repr_html_(self) -> str:
        colours = {OK: "#e6f4ea", WARN: "#fef7e0", ERROR: "#fce8e6"}
        rows = []
        for r in self.results:
            fix = (
                f"<br><b>Fix:</b> {html.escape(r.fix)}" if r.fix and r.level != OK else ""
            )
            rows.append(
                f'<tr style="background:{colours[r.level]};color:#202124">'
                f"<td>{html.escape(r.section)}</td><td>{html.escape(r.name)}</td>"
                f"<td><b>{r.level}</b></td>"
                f'<td style="text-align:left">{html.escape(r.message)}{fix}</td></tr>'
            )
        return (
            '<table class="workbench-doctor">'
            "<thead><tr><th>section</th><th>check</th><th>level</th><th>result</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>"
            f"<p>{html.escape(self.summary())}</p>"
        )
