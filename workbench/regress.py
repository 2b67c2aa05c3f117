"""`workbench regress`: run the notebooks headless and compare what they record with baselines.

A run takes a named profile from ``environment/regress_profiles.yaml`` (which
notebooks, with which parameters, under which timeouts), executes each notebook
with papermill, reads the values the notebooks stored with ``workbench.record``
and compares them with ``environment/regress_baselines.yaml``. It writes the
executed notebooks, a log per notebook and ``report.json`` / ``report.md`` to the
output folder, and fails (exit 1) on a failed notebook or a regressed metric.

Choices worth knowing:

* Each notebook runs in its own worker process (``python -m workbench.regress
  --worker SPEC``) that calls papermill. The parent owns the per-notebook deadline:
  when it passes, the worker and its kernel (the whole process tree) are killed,
  so a hung cell or a wedged kernel can never hang CI. ``--jobs N`` runs N workers
  at once.
* The kernel's working directory is the notebook's folder, as in JupyterLab, so a
  relative path means the same thing in both.
* Cell numbers in reports are 1-based positions in the *source* notebook (markdown
  cells counted; papermill's injected parameters cell not counted); ``In [n]`` is
  the execution count in the executed copy.
* A cell error is never retried (notebooks are deterministic enough that a retry
  hides bugs); only a kernel that fails to start is retried, once.
* Kernels see ``WORKBENCH_HEADLESS=1`` (progress prints lines, not bars),
  ``MPLBACKEND=Agg`` and the profile's ``env`` (``HF_HUB_OFFLINE=1`` for ci).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from workbench.errors import RegressionError
from workbench.record import read_records

PROFILES_FILE = Path("environment/regress_profiles.yaml")
BASELINES_FILE = Path("environment/regress_baselines.yaml")
DEFAULT_OUTPUT_DIR = Path("regress-out")

# Values the harness prepares and substitutes into string parameters ("{tiny_model}").
PLACEHOLDERS = ("tiny_model", "tiny_data", "output_dir")
# Enough rows for the tiny model to learn the generated task in a few epochs on CPU.
TINY_DATA_ROWS = {"train": 800, "validation": 200}
# Set for every kernel; a profile's `env` adds to (and may override) these.
KERNEL_ENV = {
    "WORKBENCH_HEADLESS": "1",  # workbench progress: log lines instead of bars/charts
    "MPLBACKEND": "Agg",  # no display in CI
    "PYDEVD_DISABLE_FILE_VALIDATION": "1",  # silences a debugger warning in every log
}
DEFAULT_CELL_TIMEOUT_S = 600.0
DEFAULT_NOTEBOOK_TIMEOUT_S = 3600.0
KERNEL_START_TIMEOUT_S = 120  # two busy cores can take a while to import ipykernel
KILL_GRACE_S = 5.0  # after SIGTERM, how long the worker gets to save before SIGKILL
DIRECTIONS = ("higher", "lower", "equal")
FAILING_VERDICTS = ("regressed", "missing", "invalid")
PROFILE_KEYS = ("description", "kernel", "cell_timeout_s", "notebook_timeout_s", "env", "notebooks")

Log = Callable[[str], None]


def _print(line: str) -> None:
    print(line, flush=True)


# -- profiles -----------------------------------------------------------------------


@dataclass
class Profile:
    """One named set of notebooks and the parameters to run them with."""

    name: str
    notebooks: dict[str, dict[str, Any]]  # path relative to the repo root -> parameters
    description: str = ""
    kernel: str = "python3"
    cell_timeout_s: float = DEFAULT_CELL_TIMEOUT_S
    notebook_timeout_s: float = DEFAULT_NOTEBOOK_TIMEOUT_S
    env: dict[str, str] = field(default_factory=dict)


def load_profiles(path: str | Path) -> dict[str, Profile]:
    """All profiles in a profiles file, validated; every problem names the key to fix."""
    path = Path(path)
    data = _load_yaml(path, "regression profiles")
    raw = data.get("profiles") if isinstance(data, dict) else None
    if not isinstance(raw, dict) or not raw:
        raise RegressionError(
            f"{path} has no `profiles:` mapping.",
            "Start the file with `profiles:` and one entry per profile (see its header comment).",
        )
    profiles = {}
    for name, body in raw.items():
        where = f"{path}: profiles.{name}"
        body = body or {}
        if not isinstance(body, dict):
            raise RegressionError(
                f"{where} must be a mapping.", f"Use the keys {', '.join(PROFILE_KEYS)}."
            )
        unknown = sorted(set(body) - set(PROFILE_KEYS))
        if unknown:
            raise RegressionError(
                f"{where} has unknown key(s) {unknown}.",
                f"Allowed keys: {', '.join(PROFILE_KEYS)}.",
            )
        notebooks = body.get("notebooks")
        if not isinstance(notebooks, dict) or not notebooks:
            raise RegressionError(
                f"{where}.notebooks is missing or empty.",
                "List notebooks as `notebooks/NAME.ipynb: {parameter: value, ...}`.",
            )
        for notebook, params in notebooks.items():
            if params is not None and not isinstance(params, dict):
                raise RegressionError(
                    f"{where}.notebooks.{notebook} must be a mapping of parameters, got {params!r}.",
                    "Write `{}` (or nothing) to run the notebook with its own defaults.",
                )
        env = body.get("env") or {}
        if not isinstance(env, dict):
            raise RegressionError(f"{where}.env must be a mapping.", "Write `env: {NAME: value}`.")
        profiles[str(name)] = Profile(
            name=str(name),
            notebooks={str(nb): dict(params or {}) for nb, params in notebooks.items()},
            description=str(body.get("description") or ""),
            kernel=str(body.get("kernel") or "python3"),
            cell_timeout_s=_positive(
                body.get("cell_timeout_s", DEFAULT_CELL_TIMEOUT_S), f"{where}.cell_timeout_s"
            ),
            notebook_timeout_s=_positive(
                body.get("notebook_timeout_s", DEFAULT_NOTEBOOK_TIMEOUT_S),
                f"{where}.notebook_timeout_s",
            ),
            env={str(k): str(v) for k, v in env.items()},
        )
    return profiles


def select_notebooks(profile: Profile, wanted: list[str] | None) -> list[str]:
    """The profile's notebooks matching ``wanted`` (a path, file name, stem or name prefix)."""
    if not wanted:
        return list(profile.notebooks)
    chosen = []
    for want in wanted:
        matches = [
            nb
            for nb in profile.notebooks
            if want in (nb, Path(nb).name, Path(nb).stem) or Path(nb).name.startswith(want)
        ]
        if not matches:
            raise RegressionError(
                f"--notebooks {want!r} matches no notebook of profile {profile.name!r}.",
                f"Choose from: {', '.join(profile.notebooks)}.",
            )
        chosen += [nb for nb in matches if nb not in chosen]
    return [nb for nb in profile.notebooks if nb in chosen]  # keep the profile's order


def notebook_parameters(path: str | Path) -> set[str] | None:
    """Names assigned in the cell tagged `parameters`, or None if the notebook has none."""
    import ast

    with open(path, encoding="utf-8") as f:
        nb = json.load(f)
    for cell in nb.get("cells", []):
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            source = "".join(cell.get("source", ""))
            names = set()
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    names.add(node.id)
            return names
    return None


def fill_placeholders(value: Any, values: Mapping[str, str]) -> Any:
    """``value`` with every ``{name}`` of ``values`` replaced, in strings at any depth."""
    if isinstance(value, str):
        for name, replacement in values.items():
            value = value.replace("{" + name + "}", str(replacement))
        return value
    if isinstance(value, dict):
        return {k: fill_placeholders(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [fill_placeholders(v, values) for v in value]
    return value


def prepare_placeholders(needed: set[str], shared_dir: Path) -> dict[str, str]:
    """Build what the chosen notebooks refer to; each is built once per output folder."""
    values = {}
    if "tiny_model" in needed:
        from transformers.utils import logging as hf_logging  # imports torch: only when needed

        from workbench.synthetic import make_tiny_bert

        hf_logging.disable_progress_bar()  # a bar per saved shard is noise in a CI log
        values["tiny_model"] = str(make_tiny_bert(shared_dir / "tiny-bert"))
    if "tiny_data" in needed:
        from workbench.synthetic import write_csv

        folder = shared_dir / "tiny-data"
        for seed, (split, rows) in enumerate(TINY_DATA_ROWS.items()):
            if not (folder / f"{split}.csv").is_file():
                write_csv(folder / f"{split}.csv", rows, seed=seed)
        values["tiny_data"] = str(folder)
    return values


def _placeholders_in(value: Any) -> set[str]:
    text = json.dumps(value)
    return {name for name in PLACEHOLDERS if "{" + name + "}" in text}


# -- baselines and comparison --------------------------------------------------------


@dataclass
class Baseline:
    """The accepted value of a metric and how far a new value may move the wrong way."""

    value: Any
    direction: str = "higher"  # higher | lower (is better), or equal (must match)
    tolerance: float = 0.0  # absolute
    relative_tolerance: float = 0.0  # fraction of |value|; the looser of the two applies

    def allowed(self) -> float:
        scale = abs(self.value) if _is_number(self.value) else 0.0
        return max(self.tolerance, self.relative_tolerance * scale)


def load_baselines(path: str | Path, profile: str) -> dict[str, dict[str, Baseline]]:
    """notebook -> metric -> Baseline for one profile; {} when the file or section is absent."""
    path = Path(path)
    if not path.exists():
        return {}
    data = _load_yaml(path, "regression baselines") or {}
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
            if direction != "equal" and not _is_number(entry["value"]):
                raise RegressionError(
                    f"{where}: value {entry['value']!r} is not a number, but direction is {direction}.",
                    "Use a number, or `direction: equal` for strings and bools.",
                )
            result[str(notebook)][str(name)] = Baseline(
                value=entry["value"],
                direction=direction,
                tolerance=_non_negative(entry.get("tolerance", 0.0), f"{where}.tolerance"),
                relative_tolerance=_non_negative(
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
        if _is_number(value) and _is_number(baseline.value):
            same = abs(value - baseline.value) <= baseline.allowed()
        else:
            same = value == baseline.value
        verdict = "pass" if same else "regressed"
        return MetricResult(
            name, value, baseline, verdict, "" if same else "differs from the baseline"
        )
    if not _is_number(value) or not math.isfinite(value):
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


# -- results and report --------------------------------------------------------------


@dataclass
class NotebookFailure:
    """Why a notebook did not run to the end."""

    kind: str  # cell_error | cell_timeout | kernel_died | kernel_start | notebook_timeout | harness
    message: str  # one line, shown in the report table
    cell: int | None = None  # 1-based position in the source notebook
    execution_count: int | None = None
    ename: str | None = None
    evalue: str | None = None
    last_output: str = ""


@dataclass
class NotebookResult:
    notebook: str  # as named in the profile
    status: str  # passed | regressed | failed
    wall_s: float
    executed_path: str | None  # None when the notebook never got written
    log_path: str
    attempts: int = 1
    failure: NotebookFailure | None = None
    metrics: list[MetricResult] = field(default_factory=list)
    records: dict[str, Any] = field(default_factory=dict)


@dataclass
class RegressReport:
    profile: str
    output_dir: Path
    started_at: str  # ISO 8601, UTC
    wall_s: float
    kernel: str
    kernel_python: str
    results: list[NotebookResult]
    baseline_changes: list[str] | None = None  # set when --update-baselines rewrote the file

    @property
    def failed_notebooks(self) -> list[NotebookResult]:
        return [r for r in self.results if r.status == "failed"]

    @property
    def regressions(self) -> list[tuple[str, MetricResult]]:
        return [(r.notebook, m) for r in self.results for m in r.metrics if m.failed]

    @property
    def ok(self) -> bool:
        return not self.failed_notebooks and not self.regressions

    def summary(self) -> str:
        if self.ok:
            return f"PASSED: {len(self.results)} notebook(s), no regression"
        return (
            f"FAILED: {len(self.failed_notebooks)} failed notebook(s), "
            f"{len(self.regressions)} regressed/missing metric(s)"
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["output_dir"] = str(self.output_dir)
        data["ok"] = self.ok
        data["summary"] = self.summary()
        return data

    def to_markdown(self) -> str:
        lines = [
            f"# Regression report: profile `{self.profile}`",
            "",
            f"{self.summary()}. {len(self.results)} notebook(s) in {self.wall_s:.1f} s, "
            f"started {self.started_at}, kernel `{self.kernel}` ({self.kernel_python}).",
            "",
            "| notebook | metric | baseline | value | verdict |",
            "|---|---|---|---|---|",
        ]
        for r in self.results:
            if not r.metrics:
                lines.append(
                    f"| {_md(r.notebook)} | — | — | — | {'failed' if r.failure else 'no metrics'} |"
                )
            for m in r.metrics:
                verdict = m.verdict + (f": {m.detail}" if m.detail and m.verdict != "pass" else "")
                lines.append(
                    f"| {_md(r.notebook)} | {_md(m.name)} | {_md(_baseline_text(m.baseline))} "
                    f"| {_md(_value_text(m.value))} | {_md(verdict)} |"
                )
        lines += [
            "",
            "| notebook | status | wall time | executed notebook | details |",
            "|---|---|---|---|---|",
        ]
        for r in self.results:
            executed = os.path.relpath(r.executed_path, self.output_dir) if r.executed_path else "—"
            details = r.failure.message if r.failure else ""
            if r.attempts > 1:
                details = f"(kernel start retried) {details}".strip()
            lines.append(
                f"| {_md(r.notebook)} | {r.status} | {r.wall_s:.1f} s | {_md(executed)} | {_md(details)} |"
            )
        for r in self.results:
            if r.failure and r.failure.last_output:
                lines += [
                    "",
                    f"Last output of {r.notebook}:",
                    "",
                    "```",
                    r.failure.last_output,
                    "```",
                ]
        if self.baseline_changes is not None:
            lines += ["", "Baselines updated (review before committing):", ""]
            lines += [f"- {change}" for change in self.baseline_changes] or ["- no value changed"]
        return "\n".join(lines) + "\n"

    def write(self) -> tuple[Path, Path]:
        """Write report.json and report.md into the output folder; return their paths."""
        json_path = self.output_dir / "report.json"
        md_path = self.output_dir / "report.md"
        json_path.write_text(
            json.dumps(self.to_dict(), indent=2, default=str) + "\n", encoding="utf-8"
        )
        md_path.write_text(self.to_markdown(), encoding="utf-8")
        return json_path, md_path


def _baseline_text(b: Baseline | None) -> str:
    if b is None:
        return "—"
    if b.direction == "equal":
        return f"{_value_text(b.value)} (equal)"
    return f"{_value_text(b.value)} ({b.direction}, ±{b.allowed():.4g})"


def _value_text(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    return json.dumps(value) if isinstance(value, (dict, list)) else str(value)


def _md(text: str) -> str:
    """Safe inside a Markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


# -- kernels -------------------------------------------------------------------------


@dataclass
class KernelChoice:
    name: str
    python: str  # the interpreter the kernel will run
    env: dict[str, str]  # extra environment for the worker (JUPYTER_PATH override)


def resolve_kernel(name: str, shared_dir: Path, log: Log = _print) -> KernelChoice:
    """Find kernel ``name``; make sure "python3" runs *this* Python (the venv's).

    jupyter_client replaces a bare ``python``/``python3`` in a kernelspec's argv
    with ``sys.executable``, so the ipykernel spec installed in the venv runs the
    venv. But a user-level spec (~/.local/share/jupyter/kernels/python3) is found
    first and may point at another interpreter that has no workbench installed;
    then we put a spec for this interpreter first on JUPYTER_PATH, for the worker only.
    """
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec(name)
    except NoSuchKernel:
        raise RegressionError(
            f"Jupyter kernel {name!r} is not installed.",
            "List kernels with `jupyter kernelspec list`; use --kernel python3, or install one "
            f"with `python -m ipykernel install --sys-prefix --name {name}`.",
        ) from None
    argv0 = spec.argv[0] if spec.argv else ""
    aliases = {
        "python",
        f"python{sys.version_info[0]}",
        "python{}.{}".format(*sys.version_info[:2]),
    }
    if argv0 in aliases:
        return KernelChoice(name, sys.executable, {})
    if name == "python3" and _bin_dir(argv0) != _bin_dir(sys.executable):
        kernel_dir = shared_dir / "jupyter" / "kernels" / name
        kernel_dir.mkdir(parents=True, exist_ok=True)
        override = {
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": f"{spec.display_name} (workbench regress)",
            "language": "python",
            "metadata": {"debugger": True},
        }
        (kernel_dir / "kernel.json").write_text(json.dumps(override, indent=1), encoding="utf-8")
        log(f"[regress] kernel python3 points at {argv0}; using {sys.executable} instead")
        jupyter_path = os.pathsep.join(
            filter(None, [str(shared_dir / "jupyter"), os.environ.get("JUPYTER_PATH")])
        )
        return KernelChoice(name, sys.executable, {"JUPYTER_PATH": jupyter_path})
    return KernelChoice(name, argv0, {})  # a kernel the user named on purpose: respected


def _bin_dir(executable: str) -> Path:
    """The folder of an interpreter, links not followed: a venv's bin/python links to the
    base interpreter, which lacks the venv's packages, so resolving links would hide that."""
    return Path(os.path.abspath(shutil.which(executable) or executable)).parent


# -- running ---------------------------------------------------------------------------


@dataclass
class _Task:
    notebook: str
    input_path: Path
    parameters: dict[str, Any]
    executed_path: Path
    log_path: Path
    spec_path: Path
    result_path: Path
    scratch_dir: Path


def regress(
    profile: str = "ci",
    *,
    notebooks: list[str] | None = None,
    output_dir: str | Path = DEFAULT_OUTPUT_DIR,
    root: str | Path = ".",
    profiles_file: str | Path | None = None,
    baselines_file: str | Path | None = None,
    kernel: str | None = None,
    cell_timeout_s: float | None = None,
    notebook_timeout_s: float | None = None,
    jobs: int = 1,
    update_baselines: bool = False,
    log: Log = _print,
) -> RegressReport:
    """Run a profile's notebooks, compare their records with the baselines, write the report.

    Relative paths (notebooks, profiles and baselines files) are taken from ``root``,
    the repository root. Returns the report; ``report.ok`` says whether CI passes.
    """
    root = Path(root).resolve()
    profiles_file = root / (profiles_file or PROFILES_FILE)
    baselines_file = root / (baselines_file or BASELINES_FILE)
    output_dir = Path(output_dir).resolve()
    profiles = load_profiles(profiles_file)
    if profile not in profiles:
        raise RegressionError(
            f"No profile {profile!r} in {profiles_file}.", f"Choose one of: {', '.join(profiles)}."
        )
    prof = profiles[profile]
    if jobs < 1:
        raise RegressionError(
            f"--jobs {jobs} must be at least 1.", "Use --jobs 1 to run one at a time."
        )
    cell_timeout = _positive(cell_timeout_s or prof.cell_timeout_s, "--cell-timeout")
    notebook_timeout = _positive(
        notebook_timeout_s or prof.notebook_timeout_s, "--notebook-timeout"
    )
    chosen = select_notebooks(prof, notebooks)
    baselines = load_baselines(baselines_file, profile)
    tasks = _check_notebooks(prof, chosen, root, output_dir)

    output_dir.mkdir(parents=True, exist_ok=True)
    shared_dir = output_dir / "shared"
    kernel_choice = resolve_kernel(kernel or prof.kernel, shared_dir, log)
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.monotonic()
    needed = set().union(*(_placeholders_in(t.parameters) for t in tasks))
    if needed - {"output_dir"}:
        log(f"[regress] preparing {', '.join(sorted(needed - {'output_dir'}))} in {shared_dir}")
    values = prepare_placeholders(needed, shared_dir)
    for task in tasks:
        task.parameters = fill_placeholders(
            task.parameters, {**values, "output_dir": str(task.scratch_dir)}
        )

    env = {**os.environ, **KERNEL_ENV, **prof.env, **kernel_choice.env}
    runner = _Runner(
        kernel=kernel_choice.name,
        cell_timeout_s=cell_timeout,
        notebook_timeout_s=notebook_timeout,
        env=env,
        baselines=baselines,
        log=log,
    )
    log(
        f"[regress] profile {profile}: {len(tasks)} notebook(s), jobs={jobs}, "
        f"cell timeout {cell_timeout:g} s, notebook timeout {notebook_timeout:g} s"
    )
    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="regress")
    try:
        results = list(pool.map(runner.run, tasks))
    finally:
        runner.kill_all()  # on Ctrl-C or an error, no worker or kernel outlives us
        pool.shutdown(wait=True, cancel_futures=True)

    report = RegressReport(
        profile=profile,
        output_dir=output_dir,
        started_at=started_at,
        wall_s=round(time.monotonic() - t0, 2),
        kernel=kernel_choice.name,
        kernel_python=kernel_choice.python,
        results=results,
    )
    if update_baselines:
        report.baseline_changes = write_updated_baselines(report, baselines_file)
        log(
            f"[regress] baselines updated in {baselines_file} ({len(report.baseline_changes)} change(s))"
        )
    json_path, md_path = report.write()
    log(f"[regress] {report.summary()}; report: {md_path}")
    return report


def _check_notebooks(prof: Profile, chosen: list[str], root: Path, output_dir: Path) -> list[_Task]:
    """Catch profile mistakes before any kernel starts: missing files, unknown parameters."""
    tasks = []
    stems = {}
    for nb in chosen:
        path = (root / nb).resolve()
        if not path.is_file():
            raise RegressionError(
                f"Notebook {nb} of profile {prof.name!r} does not exist ({path}).",
                "Fix the path in the profiles file (paths are relative to the repository root).",
            )
        params = prof.notebooks[nb]
        if params:
            declared = notebook_parameters(path)
            if declared is None:
                raise RegressionError(
                    f"{nb} has no cell tagged `parameters`, but profile {prof.name!r} sets {sorted(params)}.",
                    "Tag the notebook's parameter cell `parameters` (JupyterLab: property inspector).",
                )
            unknown = sorted(set(params) - declared)
            if unknown:
                raise RegressionError(
                    f"Profile {prof.name!r} sets {unknown} for {nb}, which its parameters cell does "
                    f"not define (it defines {sorted(declared)}).",
                    "Fix the name in the profiles file or add the parameter to the notebook.",
                )
        stem = path.stem
        if stem in stems:
            raise RegressionError(
                f"{nb} and {stems[stem]} have the same file name; their outputs would collide.",
                "Rename one of the notebooks.",
            )
        stems[stem] = nb
        tasks.append(
            _Task(
                notebook=nb,
                input_path=path,
                parameters=params,
                executed_path=output_dir / "executed" / path.name,
                log_path=output_dir / "logs" / f"{stem}.log",
                spec_path=output_dir / "logs" / f"{stem}.spec.json",
                result_path=output_dir / "logs" / f"{stem}.result.json",
                scratch_dir=output_dir / "scratch" / stem,
            )
        )
    return tasks


class _Runner:
    """Runs one notebook per worker process and turns what happened into a NotebookResult."""

    def __init__(self, *, kernel, cell_timeout_s, notebook_timeout_s, env, baselines, log):
        self.kernel = kernel
        self.cell_timeout_s = cell_timeout_s
        self.notebook_timeout_s = notebook_timeout_s
        self.env = env
        self.baselines = baselines
        self.log = log
        self._live: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._stopping = False  # set by kill_all: start no further notebook

    def run(self, task: _Task) -> NotebookResult:
        # A previous run's scratch folder could be resumed from (checkpoints): start clean.
        shutil.rmtree(task.scratch_dir, ignore_errors=True)
        task.scratch_dir.mkdir(parents=True)
        task.log_path.parent.mkdir(parents=True, exist_ok=True)
        task.executed_path.parent.mkdir(parents=True, exist_ok=True)
        for stale in (task.executed_path, task.result_path):
            stale.unlink(missing_ok=True)
        spec = {
            "input_path": str(task.input_path),
            "output_path": str(task.executed_path),
            "parameters": task.parameters,
            "kernel_name": self.kernel,
            "cell_timeout_s": self.cell_timeout_s,
            "cwd": str(task.input_path.parent),
            "result_path": str(task.result_path),
        }
        task.spec_path.write_text(json.dumps(spec, indent=1), encoding="utf-8")
        self.log(f"[regress] {task.notebook}: started")
        t0 = time.monotonic()
        timed_out = False
        with open(task.log_path, "wb") as log_file:
            proc = subprocess.Popen(
                [sys.executable, "-m", "workbench.regress", "--worker", str(task.spec_path)],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,  # Ctrl-C goes to us; we clean up
            )
            with self._lock:
                self._live.add(proc)
                if self._stopping:
                    proc.kill()
            try:
                proc.wait(timeout=self.notebook_timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_tree(proc)
            finally:
                with self._lock:
                    self._live.discard(proc)
        wall = round(time.monotonic() - t0, 2)
        result = self._result(task, proc.returncode, timed_out, wall)
        if result.status == "failed":
            self.log(f"[regress] {task.notebook}: FAILED in {wall:.1f} s: {result.failure.message}")
        else:
            bad = [m.name for m in result.metrics if m.failed]
            extra = f" ({', '.join(bad)} regressed/missing)" if bad else ""
            self.log(f"[regress] {task.notebook}: {result.status} in {wall:.1f} s{extra}")
        return result

    def kill_all(self) -> None:
        with self._lock:
            self._stopping = True
            live = list(self._live)
        for proc in live:
            _kill_tree(proc, grace_s=1.0)

    def _result(self, task: _Task, returncode: int, timed_out: bool, wall: float) -> NotebookResult:
        nb = _read_notebook(task.executed_path)
        records = read_records(nb) if nb else {}
        outcome = _read_json(task.result_path) or {}
        failure = None
        if timed_out:
            index = _running_cell(nb)
            failure = NotebookFailure(
                "notebook_timeout",
                f"ran past the notebook timeout ({self.notebook_timeout_s:g} s)"
                + (f" in cell {_source_cell(nb, index)}" if index is not None else "")
                + "; the kernel was killed",
                cell=_source_cell(nb, index) if index is not None else None,
                last_output=_last_output(nb, index),
            )
        elif outcome.get("outcome", "missing") != "ok":
            failure = self._failure(task, nb, outcome, returncode)
        metrics = compare_metrics(records, self.baselines.get(task.notebook, {}))
        if failure:
            status = "failed"
        else:
            status = "regressed" if any(m.failed for m in metrics) else "passed"
        return NotebookResult(
            notebook=task.notebook,
            status=status,
            wall_s=wall,
            executed_path=str(task.executed_path) if nb else None,
            log_path=str(task.log_path),
            attempts=int(outcome.get("attempts", 1)),
            failure=failure,
            metrics=metrics,
            records=records,
        )

    def _failure(self, task: _Task, nb, outcome: dict, returncode: int) -> NotebookFailure:
        kind = outcome.get("outcome")
        index = outcome.get("cell_index")
        cell = _source_cell(nb, index) if index is not None else None
        where = f"cell {cell}" if cell is not None else "an unknown cell"
        if kind == "cell_error":
            error = f"{outcome.get('ename')}: {_first_line(outcome.get('evalue'))}"
            count = outcome.get("execution_count")
            return NotebookFailure(
                "cell_error",
                f"{where}" + (f" (In [{count}])" if count else "") + f": {error}",
                cell=cell,
                execution_count=count,
                ename=outcome.get("ename"),
                evalue=outcome.get("evalue"),
            )
        if kind == "cell_timeout":
            return NotebookFailure(
                "cell_timeout",
                f"{where} ran past the cell timeout ({self.cell_timeout_s:g} s)",
                cell=cell,
                last_output=_last_output(nb, index),
            )
        if kind == "kernel_died":
            last = _last_output(nb, index)
            tail = f"; last output: {_last_line(last)}" if last else ""
            return NotebookFailure(
                "kernel_died", f"kernel died in {where}{tail}", cell=cell, last_output=last
            )
        if kind == "kernel_start":
            return NotebookFailure(
                "kernel_start",
                f"kernel {self.kernel!r} failed to start "
                f"({'tried twice' if outcome.get('attempts', 1) > 1 else 'not retried'}): "
                f"{_first_line(outcome.get('message'))}",
            )
        if kind == "error":
            return NotebookFailure("harness", _first_line(outcome.get("message")), cell=cell)
        tail = _tail(task.log_path)
        return NotebookFailure(
            "harness",
            f"the worker exited with code {returncode} without a result; see {task.log_path}",
            last_output=tail,
        )


def _kill_tree(proc: subprocess.Popen, grace_s: float = KILL_GRACE_S) -> None:
    """Stop a worker and everything it started (its kernel is in a session of its own).

    SIGTERM first: nbclient then shuts the kernel down and papermill saves the
    notebook. Whatever still runs after ``grace_s`` is killed.
    """
    import psutil

    try:
        tree = [psutil.Process(proc.pid)]
        tree += tree[0].children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    with suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    with suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    for p in tree:  # kernels, and anything they started, are gone too
        with suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(tree, timeout=5)
    proc.wait()


# -- reading executed notebooks ------------------------------------------------------


def _read_notebook(path: Path) -> dict | None:
    return _read_json(path)


def _read_json(path: Path) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _source_cell(nb: dict | None, index: int | None) -> int | None:
    """1-based position in the source notebook of executed cell ``index``."""
    if index is None:
        return None
    if not nb:
        return index + 1
    injected = sum(
        1
        for i, cell in enumerate(nb.get("cells", [])[:index])
        if "injected-parameters" in cell.get("metadata", {}).get("tags", [])
    )
    return index + 1 - injected


def _running_cell(nb: dict | None) -> int | None:
    """The cell papermill marked as running when it last saved (the one that hung)."""
    cells = (nb or {}).get("cells", [])
    running = [
        i
        for i, c in enumerate(cells)
        if c.get("metadata", {}).get("papermill", {}).get("status") == "running"
    ]
    return running[-1] if running else None


def _last_output(nb: dict | None, upto: int | None = None) -> str:
    """The tail of the last text output at or before cell ``upto``."""
    cells = (nb or {}).get("cells", [])
    if upto is not None:
        cells = cells[: upto + 1]
    for cell in reversed(cells):
        for output in reversed(cell.get("outputs", []) or []):
            if output.get("output_type") == "stream":
                text = _join(output.get("text"))
            elif output.get("output_type") == "error":
                if output.get("ename") == "KeyboardInterrupt":
                    continue  # the harness's own interrupt at a timeout, not the notebook's output
                text = f"{output.get('ename')}: {output.get('evalue')}"
            else:
                text = _join((output.get("data") or {}).get("text/plain"))
            lines = [line for line in text.splitlines() if line.strip()]
            if lines:
                return "\n".join(lines[-5:])[-1000:]
    return ""


def _join(text: Any) -> str:
    return "".join(text) if isinstance(text, list) else str(text or "")


def _first_line(text: Any) -> str:
    lines = [line for line in str(text or "").splitlines() if line.strip()]
    return (lines[0] if lines else "")[:300]


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return (lines[-1] if lines else "")[:300]


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-n:])
    except OSError:
        return ""


# -- updating baselines --------------------------------------------------------------


def write_updated_baselines(report: RegressReport, path: str | Path) -> list[str]:
    """Set each existing baseline's value to this run's; keep direction and tolerance.

    Notebooks that failed are left alone, and new records are not added (their
    direction and tolerance need a person): the report lists them as "no baseline".
    Only the ``value:`` of changed entries is edited in place, so comments stay and
    the diff a maintainer reviews shows just the numbers. Returns one line per change.
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
            numeric = _is_number(new) and math.isfinite(new)
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


_KEY_LINE = re.compile(
    r"""^(?P<indent>\s*)(?P<q>["']?)(?P<key>[^"'#\s][^"'#]*?)(?P=q):(?:\s+|$)(?P<rest>.*)$"""
)
_FLOW_VALUE = re.compile(r"(\bvalue:\s*)([^,}]+?)(\s*[,}])")


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


# -- small helpers -------------------------------------------------------------------


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _positive(value: Any, where: str) -> float:
    if not _is_number(value) or value <= 0:
        raise RegressionError(
            f"{where}={value!r} must be a positive number of seconds.", "Use e.g. 600."
        )
    return float(value)


def _non_negative(value: Any, where: str) -> float:
    if not _is_number(value) or value < 0:
        raise RegressionError(f"{where}={value!r} must be a number >= 0.", "Use e.g. 0.05.")
    return float(value)


def _load_yaml(path: Path, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except FileNotFoundError:
        raise RegressionError(
            f"The {what} file {path} does not exist.",
            "Run from the repository root, or pass --root / the file's path.",
        ) from None
    except yaml.YAMLError as exc:
        raise RegressionError(
            f"{path} is not valid YAML: {exc}", "Fix the syntax at the line shown."
        ) from None


# -- the worker (one notebook, inside its own process) -------------------------------


def execute_one(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Execute one notebook with papermill; return what happened as plain data.

    Runs in the worker process. Only a kernel that never came up is retried (once).
    """
    import papermill as pm
    from jupyter_client.kernelspec import NoSuchKernel
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from papermill.exceptions import PapermillExecutionError

    outcome: dict[str, Any] = {}
    for attempt in (1, 2):
        state: dict[str, Any] = {"kernel_started": False, "cell_index": None}

        def on_notebook_start(state=state, **_):
            state["kernel_started"] = True

        def on_cell_start(state=state, cell_index=None, **_):
            state["cell_index"] = cell_index

        try:
            pm.execute_notebook(
                spec["input_path"],
                spec["output_path"],
                parameters=spec.get("parameters") or {},
                kernel_name=spec["kernel_name"],
                language="python",  # lets papermill parameterize notebooks without kernel metadata
                progress_bar=False,
                log_output=True,
                cwd=spec["cwd"],
                start_timeout=KERNEL_START_TIMEOUT_S,
                execution_timeout=spec["cell_timeout_s"],
                on_notebook_start=on_notebook_start,
                on_cell_start=on_cell_start,
            )
            return {"outcome": "ok", "attempts": attempt}
        except PapermillExecutionError as exc:
            return {
                "outcome": "cell_error",
                "attempts": attempt,
                "cell_index": exc.cell_index,
                "execution_count": exc.exec_count,
                "ename": exc.ename,
                "evalue": exc.evalue,
            }
        except CellTimeoutError:
            return {
                "outcome": "cell_timeout",
                "attempts": attempt,
                "cell_index": state["cell_index"],
            }
        except DeadKernelError:
            return {
                "outcome": "kernel_died",
                "attempts": attempt,
                "cell_index": state["cell_index"],
            }
        except NoSuchKernel as exc:
            return {
                "outcome": "kernel_start",
                "attempts": attempt,
                "message": f"no such kernel: {exc}",
            }
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}"
            if state["kernel_started"]:
                return {
                    "outcome": "error",
                    "attempts": attempt,
                    "cell_index": state["cell_index"],
                    "message": message,
                }
            outcome = {"outcome": "kernel_start", "attempts": attempt, "message": message}
            logging.getLogger("workbench.regress").warning(
                "kernel failed to start (%s)%s", message, "; retrying once" if attempt == 1 else ""
            )
    return outcome


def _worker_main(argv: list[str]) -> int:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stdout,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    outcome = execute_one(spec)
    result_path = Path(spec["result_path"])
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(outcome, default=str), encoding="utf-8")
    tmp.replace(result_path)  # the parent never reads half a result
    return 0


# -- CLI -----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profile", default="ci", help="profile in the profiles file (default: ci)"
    )
    parser.add_argument(
        "--notebooks",
        nargs="+",
        metavar="NB",
        help="run only these notebooks of the profile (path, file name, stem or prefix like 01)",
    )
    parser.add_argument(
        "--output-dir",
        default=str(DEFAULT_OUTPUT_DIR),
        help="folder for executed notebooks, logs and report.md/json (default: regress-out)",
    )
    parser.add_argument(
        "--cell-timeout", type=float, metavar="S", help="seconds per cell (default: profile's)"
    )
    parser.add_argument(
        "--notebook-timeout",
        type=float,
        metavar="S",
        help="seconds per notebook (default: profile's)",
    )
    parser.add_argument(
        "--kernel", help="Jupyter kernel name (default: the profile's, usually python3)"
    )
    parser.add_argument(
        "--jobs", type=int, default=1, metavar="N", help="notebooks run at once (default: 1)"
    )
    parser.add_argument(
        "--update-baselines",
        action="store_true",
        help="write this run's values into the baselines file (keeps direction/tolerance) for review",
    )
    parser.add_argument("--root", default=".", help="repository root (default: current folder)")
    parser.add_argument("--profiles-file", default=str(PROFILES_FILE), help="relative to --root")
    parser.add_argument("--baselines-file", default=str(BASELINES_FILE), help="relative to --root")


def run_cli(args: argparse.Namespace) -> int:
    report = regress(
        args.profile,
        notebooks=args.notebooks,
        output_dir=args.output_dir,
        root=args.root,
        profiles_file=args.profiles_file,
        baselines_file=args.baselines_file,
        kernel=args.kernel,
        cell_timeout_s=args.cell_timeout,
        notebook_timeout_s=args.notebook_timeout,
        jobs=args.jobs,
        update_baselines=args.update_baselines,
    )
    if args.update_baselines:
        # The new values are the baselines now; only a notebook that did not run fails.
        return 1 if report.failed_notebooks else 0
    return 0 if report.ok else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        sys.exit(_worker_main(sys.argv[2:]))
    sys.exit("usage: python -m workbench.regress --worker SPEC.json (use `workbench regress`)")
