"""The one report of scripts/gpu_check.sh: report.json and report.md from what its parts left in
the output folder. Standard library only, so the report is written even when torch is broken.

What the parts leave (all optional; a missing file is a part that did not run):

    parts/<part>.json     {"status": "ok"|"failed"|"skipped", "reason": "...", "seconds": 1.2}
    versions.json         {"python": "3.11.9", "torch": "2.11.0+cu130", ...}
    device.json           {"gpus": [{"name": ..., "memory": ..., "driver": ..., "compute_cap": ...}], ...}
    tests.xml             pytest's JUnit XML of tests/gpu
    gpu_throughput.json   benchmarks/gpu_throughput.py's figures

    python scripts/gpu_check_report.py OUT_DIR   # exit 0 when both files were written
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

PART_ORDER = ("wheels", "versions", "device", "tests", "benchmarks")


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_tests(path: Path) -> list[dict]:
    """Each test case of a JUnit XML file: {"test", "outcome", "seconds", "message"}."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return []
    tests = []
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}".strip(":")
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (found.get("message") or found.text or "").strip().splitlines()[0:1]
                message = message[0][:300] if message else ""
                break
        tests.append({"test": name, "outcome": outcome, "seconds": float(case.get("time") or 0),
                      "message": message})
    return tests


def build(out: Path) -> dict:
    parts = {}
    for path in sorted((out / "parts").glob("*.json")):
        parts[path.stem] = _read_json(path) or {"status": "failed", "reason": f"{path.name} is unreadable"}
    ordered = {p: parts.pop(p) for p in PART_ORDER if p in parts}
    ordered.update(parts)
    tests = read_tests(out / "tests.xml")
    counts: dict[str, int] = {}
    for t in tests:
        counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
    device = _read_json(out / "device.json") or {}
    return {
        "report": "gpu_check", "version": 1,
        "started": (_read_json(out / "started.json") or {}).get("started"),
        "gpu": bool(device.get("cuda_available")),
        "no_gpu_reason": device.get("no_gpu_reason"),
        "failed_parts": [p for p, r in ordered.items() if r.get("status") == "failed"],
        "parts": ordered,
        "versions": _read_json(out / "versions.json") or {},
        "device": device,
        "tests": {"counts": counts, "cases": tests},
        "benchmarks": {"gpu_throughput": _read_json(out / "gpu_throughput.json")},
    }


def _cell(value) -> str:
    return "" if value is None else str(value).replace("|", "\\|").replace("\n", " ")


def _throughput_rows(figures: dict) -> list[str]:
    rows = ["| model | loop | samples/s | real tokens/s | step ms | TFLOP/s | MFU | peak MiB | final loss |",
            "|---|---|---|---|---|---|---|---|---|"]
    for part in (figures.get("parts") or {}).values():
        if "skipped" in part or "failed" in part:
            rows.append(f"| {_cell(part.get('model', '?'))} | - | {_cell(part.get('skipped') or part.get('failed'))}"
                        " | | | | | | |")
            continue
        for loop in ("workbench", "eager"):
            r = part.get(loop) or {}
            mfu = r.get("mfu")
            mfu = f"{mfu:.1%}" if isinstance(mfu, (int, float)) else _cell(mfu)
            step = r.get("step_s")
            step_ms = f"{step * 1000:.1f}" if isinstance(step, (int, float)) else ""
            rows.append(f"| {_cell(part.get('model'))} | {loop} | {_cell(r.get('samples_per_s'))} | "
                        f"{_cell(r.get('tokens_per_s'))} | {step_ms} | {_cell(r.get('tflops_per_s'))} | {mfu} | "
                        f"{_cell(r.get('peak_allocated_mib'))} | {_cell(r.get('final_loss'))} |")
        rows.append(f"| | workbench / eager | | {_cell(part.get('workbench_over_eager'))}x | | | | | |")
    return rows


def markdown(report: dict) -> str:
    lines = ["# GPU check", ""]
    if report["gpu"]:
        gpus = report["device"].get("gpus") or []
        lines.append("GPU: " + "; ".join(f"{g.get('name')} ({g.get('memory')}, driver {g.get('driver')}, "
                                        f"compute capability {g.get('compute_cap')})" for g in gpus))
    else:
        lines.append(f"**no GPU**: {report.get('no_gpu_reason') or 'CUDA is not available'}; "
                     "the GPU parts are skipped.")
    if report["started"]:
        lines.append(f"Started {report['started']}.")
    failed = report["failed_parts"]
    lines += ["", f"Failed parts: {', '.join(failed)}." if failed else "No part failed.", "",
              "## Parts", "", "| part | status | seconds | reason |", "|---|---|---|---|"]
    for name, part in report["parts"].items():
        lines.append(f"| {name} | {_cell(part.get('status'))} | {_cell(part.get('seconds'))} | "
                     f"{_cell(part.get('reason'))} |")
    lines += ["", "## Versions", "", "| package | version |", "|---|---|"]
    lines += [f"| {k} | {_cell(v) or 'none (not installed, or not found)'} |" for k, v in report["versions"].items()]
    lines += ["", "## Device", "", "```", json.dumps(report["device"], indent=2), "```", "", "## tests/gpu", ""]
    cases = report["tests"]["cases"]
    if cases:
        lines.append(", ".join(f"{n} {k}" for k, n in sorted(report["tests"]["counts"].items())) + ".")
        lines += ["", "| test | outcome | seconds | message |", "|---|---|---|---|"]
        lines += [f"| {_cell(t['test'])} | {t['outcome']} | {t['seconds']:.1f} | {_cell(t['message'])} |"
                  for t in cases]
    else:
        lines.append("not run (see Parts).")
    lines += ["", "## Benchmarks", ""]
    figures = report["benchmarks"].get("gpu_throughput")
    if figures:
        lines.append(f"gpu_throughput on {figures.get('device')} (peak bf16 {figures.get('peak_bf16_tflops')} "
                     f"TFLOP/s; {figures.get('flops_formula')}; fit args {figures.get('fit_args')}):")
        lines += [""] + _throughput_rows(figures)
    else:
        lines.append("not run (see Parts).")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: gpu_check_report.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    report = build(out)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (out / "report.md").write_text(markdown(report), encoding="utf-8")
    print(f"report: {out / 'report.md'} and {out / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
