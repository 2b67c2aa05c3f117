"""``regress()``: run a profile's notebooks, compare their records with baselines, write the report."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

from workbench.errors import RegressionError
from workbench.notebook_regression import bundled
from workbench.notebook_regression.baselines import load_baselines
from workbench.notebook_regression.checks import positive
from workbench.notebook_regression.console import Log, print_line
from workbench.notebook_regression.kernels import resolve_kernel
from workbench.notebook_regression.placeholders import (
    fill_placeholders,
    placeholders_in,
    prepare_placeholders,
)
from workbench.notebook_regression.profiles import (
    Profile,
    load_profiles,
    notebook_parameters,
    select_notebooks,
)
from workbench.notebook_regression.report import RegressReport
from workbench.notebook_regression.runner import Runner
from workbench.notebook_regression.task import Task
from workbench.notebook_regression.update_baselines import write_updated_baselines

DEFAULT_OUTPUT_DIR = Path("regress-out")
# Set for every kernel; a profile's `env` adds to (and may override) these.
KERNEL_ENV = {
    "WORKBENCH_HEADLESS": "1",  # workbench progress: log lines instead of bars/charts
    "MPLBACKEND": "Agg",  # no display in CI
    # tqdm bars of datasets/transformers print one line per update in a headless log.
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "PYDEVD_DISABLE_FILE_VALIDATION": "1",  # silences a debugger warning in every log
}


def regress(
    profile: str = "ci",
    *,
    notebooks: list[str] | None = None,
    output_dir: str | Path = DEFAULT_OUTPUT_DIR,
    notebooks_dir: str | Path | None = None,
    profiles_file: str | Path | None = None,
    baselines_file: str | Path | None = None,
    kernel: str | None = None,
    cell_timeout_s: float | None = None,
    notebook_timeout_s: float | None = None,
    jobs: int = 1,
    update_baselines: bool = False,
    log: Log = print_line,
) -> RegressReport:
    """Run a profile's notebooks, compare their records with the baselines, write the report.

    The profile's notebook paths are relative to ``notebooks_dir``; the notebooks,
    profiles and baselines default to the copies shipped in the package, which in a
    checkout's editable install are the checkout's own files, so nothing depends on the
    working directory. Returns the report; ``report.ok`` says whether CI passes.
    """
    notebooks_dir = Path(notebooks_dir or bundled.notebooks_dir()).resolve()
    profiles_file = Path(profiles_file or bundled.profiles_file()).resolve()
    baselines_file = Path(baselines_file or bundled.baselines_file()).resolve()
    output_dir = Path(output_dir).resolve()
    if update_baselines:  # before any kernel starts: a refusal costs a second, not a run
        bundled.check_baselines_writable(baselines_file)
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
    cell_timeout = positive(cell_timeout_s or prof.cell_timeout_s, "--cell-timeout")
    notebook_timeout = positive(notebook_timeout_s or prof.notebook_timeout_s, "--notebook-timeout")
    chosen = select_notebooks(prof, notebooks)
    baselines = load_baselines(baselines_file, profile)
    tasks = _check_notebooks(prof, chosen, notebooks_dir, output_dir)

    output_dir.mkdir(parents=True, exist_ok=True)
    shared_dir = output_dir / "shared"
    kernel_choice = resolve_kernel(kernel or prof.kernel, shared_dir, log)
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.monotonic()
    needed = set().union(*(placeholders_in(t.parameters) for t in tasks))
    if needed - {"output_dir"}:
        log(f"[regress] preparing {', '.join(sorted(needed - {'output_dir'}))} in {shared_dir}")
    values = prepare_placeholders(needed, shared_dir)
    for task in tasks:
        task.parameters = fill_placeholders(
            task.parameters, {**values, "output_dir": str(task.scratch_dir)}
        )

    env = {**os.environ, **KERNEL_ENV, **prof.env, **kernel_choice.env}
    runner = Runner(
        kernel=kernel_choice.name,
        cell_timeout_s=cell_timeout,
        notebook_timeout_s=notebook_timeout,
        env=env,
        baselines=baselines,
        log=log,
    )
    log(
        f"[regress] profile {profile}: {len(tasks)} notebook(s) from {notebooks_dir}, jobs={jobs}, "
        f"cell timeout {cell_timeout:g} s, notebook timeout {notebook_timeout:g} s"
    )
    # Threads only wait on worker processes, so N threads run N notebooks at once.
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
        notebooks_dir=str(notebooks_dir),
        profiles_file=str(profiles_file),
        baselines_file=str(baselines_file),
    )
    if update_baselines:
        report.baseline_changes = write_updated_baselines(report, baselines_file)
        log(
            f"[regress] baselines updated in {baselines_file} ({len(report.baseline_changes)} change(s))"
        )
    _, md_path = report.write()
    log(f"[regress] {report.summary()}; report: {md_path}")
    return report


def _check_notebooks(
    prof: Profile, chosen: list[str], notebooks_dir: Path, output_dir: Path
) -> list[Task]:
    """Catch profile mistakes before any kernel starts: missing files, unknown parameters."""
    tasks = []
    stems = {}
    for nb in chosen:
        path = (notebooks_dir / nb).resolve()
        if not path.is_file():
            raise RegressionError(
                f"Notebook {nb} of profile {prof.name!r} does not exist ({path}).",
                "Fix the path in the profiles file (paths are relative to the notebooks folder, "
                "--notebooks-dir).",
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
            Task(
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
