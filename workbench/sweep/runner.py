"""Run a sweep here: ``sweep(notebook, grid)`` -> SweepResult.

How many at once: on a machine with N GPUs, up to N combinations, each in its own
process with ``CUDA_VISIBLE_DEVICES`` set to one GPU and a share of the CPU threads.
Without a GPU, one at a time with every core: two trainings on the same cores slow each
other down many times over (each runs its matrix products on all cores, and they evict
each other's caches), so running them side by side finishes later than one after the other.

Resumable: a combination whose status file says ``completed`` is skipped; any other (never
started, failed, or interrupted by a kill of the sweep) runs again, and its ``fit`` resumes
from the newest checkpoint in its folder. A failing combination is recorded (the cell and
the error) and the sweep goes on; the result lists the failures.

One sweep per folder: ``run_plan`` holds ``<root>/.sweep.lock`` (``engine/run_lock.py``, the
lock runs use) for as long as it runs, so a second sweep on the same folder is refused at
once, naming the first (pid, host, start, command), instead of reporting each of the first
one's combinations as ``failed: OutputDirLockedError``. A Slurm array's tasks share the lock
(one per combination, side by side); a sweep here and an array on one folder exclude each
other. And a ``completed`` status is final (``plan.write_status``).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.engine import run_lock
from workbench.engine.safe_read import read_text_bounded
from workbench.errors import ConfigError, WorkbenchError
from workbench.server.processes import safe_module_argv
from workbench.sweep import grid as grids
from workbench.sweep.plan import Plan, read_status, write_json, write_status

INHERIT = "inherit"  # run with the environment's devices as they are (a Slurm array task)
RESULT_FILE = ".sweep-result.json"
LOG_FILE = "sweep.log"
LOCK_FILE = ".sweep.lock"  # one sweep per folder (a dot-file: never taken for a run's lock)


@dataclass
class Outcome:
    """What became of one combination in this call."""

    name: str
    parameters: dict[str, Any]
    status: str  # completed | failed | skipped (completed before)
    folder: Path
    device: str | None = None
    seconds: float | None = None
    error: str | None = None


class SweepResult:
    """The combinations of a sweep and what became of them; ``runs()`` is its runs table."""

    def __init__(self, plan: Plan, outcomes: list[Outcome]):
        self.plan = plan
        self.outcomes = outcomes

    @property
    def root(self) -> Path:
        return self.plan.root_path

    def _with(self, status: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == status]

    @property
    def completed(self) -> list[Outcome]:
        return self._with("completed")

    @property
    def failed(self) -> list[Outcome]:
        return self._with("failed")

    @property
    def skipped(self) -> list[Outcome]:
        return self._with("skipped")

    def runs(self):
        from workbench.engine.runs import runs

        return runs(self.root)

    def summary(self) -> str:
        lines = [f"sweep {self.plan.name}: {len(self.completed)} completed, {len(self.skipped)} already done, "
                 f"{len(self.failed)} failed, in {self.root}"]
        lines += [f"  failed: {o.name}: {o.error} (log: {o.folder / LOG_FILE})" for o in self.failed]
        if self.failed:
            lines.append("  fix the cause and run the same sweep again: finished combinations are skipped.")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"SweepResult({self.plan.name!r}: {len(self.completed)} completed, {len(self.skipped)} skipped, "
                f"{len(self.failed)} failed)")


# -- the plan -----------------------------------------------------------------------------


def make_plan(notebook: str | os.PathLike, grid: Mapping[str, Sequence] | Iterable[str], *, name: str | None = None,
              outputs: str | os.PathLike = "outputs", parameters: Mapping[str, Any] | None = None,
              kernel: str = "python3", cell_timeout_s: int | None = None,
              env: Mapping[str, str] | None = None) -> Plan:
    """Check the notebook and the names of the parameters, and list the combinations."""
    notebook = Path(notebook).resolve()
    if not notebook.is_file():
        raise WorkbenchError(f"There is no notebook {notebook}.", "pass the path of an .ipynb file.")
    if not isinstance(grid, Mapping):
        grid = grids.parse_grid(grid)
    grid = {k: list(v) for k, v in grid.items()}
    if not grid or not all(grid.values()):
        raise ConfigError("grid", grid, "at least one parameter with at least one value",
                          fix="e.g. --grid learning_rate=1e-5,2e-5")
    parameters = dict(parameters or {})
    declared = _notebook_parameters(notebook)
    unknown = sorted((set(grid) | set(parameters)) - set(declared))
    if unknown:
        raise ConfigError(unknown[0], (grid | parameters)[unknown[0]],
                          f"a parameter of {notebook.name}: " + ", ".join(sorted(declared)),
                          fix="add it to the notebook's `parameters` cell, or sweep one of those.")
    output_parameter = "output_dir" if "output_dir" in declared else None
    name = name or f"{notebook.stem}-sweep"
    if grids.combination_name({"n": name}) != f"n={name}" or "," in name or "=" in name or name.startswith("."):
        # "." and ".." would put the sweep in (or above) --outputs itself; a hidden folder is
        # not searched by the runs table.
        raise ConfigError("name", name, "letters, digits, '.', '_', '-', not starting with '.' (it is a folder name)",
                          fix="e.g. --name lr-sweep.")
    return Plan(name=name, root=str((Path(outputs) / name).resolve()), notebook=str(notebook), grid=grid,
                parameters=parameters, combinations=grids.combinations(grid), kernel=kernel,
                output_parameter=output_parameter, cell_timeout_s=cell_timeout_s, env=dict(env or {}))


def _notebook_parameters(notebook: Path) -> dict[str, Any]:
    import papermill as pm

    from workbench.notebook_regression.worker import literal_path

    declared = pm.inspect_notebook(literal_path(str(notebook)))
    if not declared:
        raise WorkbenchError(f"{notebook.name} has no `parameters` cell, so a sweep has nothing to change.",
                             "tag the cell that sets the settings with `parameters` (JupyterLab: the gear "
                             "icon, Cell tags).")
    return declared


# -- devices ------------------------------------------------------------------------------


def resolve_devices(devices: str | Sequence[str] | None = "auto") -> list[str | None]:
    """The slots to run in: one GPU id each, or ``[None]`` (the CPU: one at a time).

    ``"auto"``: the GPUs in ``CUDA_VISIBLE_DEVICES`` when it is set, else those NVML
    counts; ``"cpu"`` or None: none; ``"0,1"`` or ``["0", "1"]``: those ids;
    ``"inherit"``: one slot with the environment unchanged (a Slurm array task).
    """
    if devices == INHERIT:
        return [INHERIT]
    if devices is None or devices == "cpu":
        return [None]
    if devices == "auto":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            ids = [d.strip() for d in visible.split(",") if d.strip() and d.strip() != "-1"]
        else:
            from workbench.gpu.nvml import nvml_status

            status = nvml_status()
            ids = [str(i) for i in range(status.count)] if status.available else []
        return ids or [None]
    ids = [d.strip() for d in devices.split(",")] if isinstance(devices, str) else [str(d) for d in devices]
    ids = [d for d in ids if d]
    if len(set(ids)) != len(ids):
        raise ConfigError("devices", devices, "distinct GPU ids, e.g. 0,1")
    return ids or [None]


def _environment(plan: Plan, device: str | None, slots: int, kernel_env: Mapping[str, str]) -> dict[str, str]:
    env = {**os.environ, **kernel_env, "MPLBACKEND": "Agg", "WORKBENCH_HEADLESS": "1",
           "WORKBENCH_SWEEP_PARENT": str(os.getpid()), **plan.env}
    if device is not None and device != INHERIT:
        env["CUDA_VISIBLE_DEVICES"] = device
        # Each GPU's run also uses the CPU (tokenizing, the loader, the optimizer's host work):
        # split the cores so that N runs do not start N x cores threads.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // slots)))
    return env


# -- running ------------------------------------------------------------------------------


def sweep(notebook: str | os.PathLike, grid: Mapping[str, Sequence] | Iterable[str], *, name: str | None = None,
          outputs: str | os.PathLike = "outputs", parameters: Mapping[str, Any] | None = None,
          devices: str | Sequence[str] | None = "auto", kernel: str = "python3",
          cell_timeout_s: int | None = None, env: Mapping[str, str] | None = None,
          on_update: Callable[[Outcome | None], None] | None = None,
          log: Callable[[str], None] = print) -> SweepResult:
    """Run ``notebook`` once per combination of ``grid`` into ``outputs/<name>/<combination>/``.

    ``grid``: ``{"learning_rate": [1e-5, 2e-5], "seed": [1, 2]}`` or ``["learning_rate=1e-5,2e-5", ...]``.
    ``parameters``: fixed values for every combination. ``devices``: see ``resolve_devices``.
    ``on_update``: called when a combination starts (None) and ends (its Outcome): a live table.
    Running the same call again skips the finished combinations and resumes the others.
    """
    plan = make_plan(notebook, grid, name=name, outputs=outputs, parameters=parameters, kernel=kernel,
                     cell_timeout_s=cell_timeout_s, env=env)
    return run_plan(plan, devices=devices, on_update=on_update, log=log)


def hold(plan: Plan, *, shared: bool = False) -> run_lock.RunLock:
    """The sweep folder's lock (OutputDirLockedError naming the sweep that holds it). ``shared``:
    a Slurm array task, one of many that run the same sweep side by side."""
    return run_lock.acquire(plan.root_path, lock_file=LOCK_FILE, kind="sweep", shared=shared)


def run_plan(plan: Plan, *, devices: str | Sequence[str] | None = "auto", indexes: Sequence[int] | None = None,
             on_update: Callable[[Outcome | None], None] | None = None,
             log: Callable[[str], None] = print) -> SweepResult:
    """Run the plan's combinations (``indexes``: only those) that have not completed yet.

    Holds the sweep folder's lock throughout and saves the plan under it; with
    ``devices="inherit"`` (a Slurm array task) the lock is shared and the plan only read.
    """
    slots = resolve_devices(devices)
    lock = hold(plan, shared=slots == [INHERIT])
    try:
        if slots != [INHERIT]:
            plan.save()
        return _run_combinations(plan, slots, indexes, on_update, log)
    finally:
        lock.release()


def _run_combinations(plan: Plan, slots: list, indexes: Sequence[int] | None,
                      on_update: Callable[[Outcome | None], None] | None, log: Callable[[str], None]) -> SweepResult:
    from workbench.notebook_regression.kernels import resolve_kernel

    chosen = [plan.combinations[i] for i in indexes] if indexes is not None else list(plan.combinations)
    kernel = resolve_kernel(plan.kernel, plan.root_path / ".sweep", log=log)
    outcomes: dict[str, Outcome] = {}
    todo = []
    for combination in chosen:
        folder = plan.folder(combination)
        if read_status(folder).get("status") == "completed":
            outcomes[combination.name] = Outcome(combination.name, combination.parameters, "skipped", folder)
        else:
            todo.append(combination)
    if slots == [None]:
        log(f"sweep {plan.name}: {len(todo)} to run, {len(outcomes)} already done; no GPU: one at a time "
            "(two trainings on the same CPU cores slow each other down many times over)")
    elif slots != [INHERIT]:
        log(f"sweep {plan.name}: {len(todo)} to run, {len(outcomes)} already done; up to {len(slots)} at once, "
            f"one GPU each ({', '.join(map(str, slots))})")
    free: queue.Queue = queue.Queue()
    for slot in slots:
        free.put(slot)
    notify = threading.Lock()

    def update(outcome: Outcome | None) -> None:
        if on_update is not None:
            with notify:
                on_update(outcome)

    def run(combination: grids.Combination) -> Outcome:
        device = free.get()
        try:
            update(None)
            outcome = run_combination(plan, combination, device, len(slots), kernel.env, log=log)
        finally:
            free.put(device)
        update(outcome)
        return outcome

    with ThreadPoolExecutor(max_workers=len(slots), thread_name_prefix="workbench-sweep") as pool:
        for outcome in pool.map(run, todo):
            outcomes[outcome.name] = outcome
    return SweepResult(plan, [outcomes[c.name] for c in chosen])


def run_combination(plan: Plan, combination: grids.Combination, device: str | None, slots: int = 1,
                    kernel_env: Mapping[str, str] | None = None, *, log: Callable[[str], None] = print) -> Outcome:
    """Execute the notebook for one combination in a worker process; never raises for the notebook's errors."""
    folder = plan.folder(combination)
    folder.mkdir(parents=True, exist_ok=True)
    _wait_until_free(folder)
    shown_device = None if device in (None, INHERIT) else device
    write_status(folder, "running", device=shown_device, parameters=combination.parameters)
    notebook = Path(plan.notebook)
    result_path = folder / RESULT_FILE
    result_path.unlink(missing_ok=True)
    spec = {"input_path": str(notebook), "output_path": str(folder / notebook.name),
            "parameters": plan.parameters_of(combination), "kernel_name": plan.kernel, "cwd": str(notebook.parent),
            "cell_timeout_s": plan.cell_timeout_s, "result_path": str(result_path)}
    spec_path = write_json(folder / ".sweep-spec.json", spec)
    where = f" on GPU {shown_device}" if shown_device is not None else ""
    log(f"sweep {plan.name}: {combination.name}{where}: started")
    started = time.monotonic()
    with (folder / LOG_FILE).open("ab") as out:
        # In the notebook's folder, which the notebook can write: -P keeps it off the worker's sys.path.
        proc = subprocess.run([*safe_module_argv(sys.executable, "workbench.sweep.worker"), str(spec_path)], stdout=out,
                              stderr=subprocess.STDOUT, env=_environment(plan, device, slots, kernel_env or {}),
                              cwd=str(notebook.parent), check=False)
    seconds = round(time.monotonic() - started, 1)
    error = _error(proc.returncode, result_path)
    status = "failed" if error else "completed"
    # A status another runner already made "completed" stays so (write_status keeps it).
    write_status(folder, status, device=shown_device, parameters=combination.parameters, seconds=seconds,
                 error=error)
    log(f"sweep {plan.name}: {combination.name}: {status} in {seconds:.0f} s" + (f": {error}" if error else ""))
    return Outcome(combination.name, combination.parameters, status, folder, shown_device, seconds, error)


def _error(returncode: int, result_path: Path) -> str | None:
    try:
        result = json.loads(read_text_bounded(result_path, 1 << 20))
    except (OSError, ValueError):
        return f"the worker exited with status {returncode} without a result"
    if result.get("outcome") == "ok":
        return None
    if result.get("outcome") == "cell_error":
        return f"cell {result.get('execution_count') or result.get('cell_index')}: {result.get('ename')}: " \
               f"{str(result.get('evalue', ''))[:300]}"
    return f"{result.get('outcome')}: {result.get('message', '')}".strip(": ")


def _wait_until_free(folder: Path, patience_s: float = 20.0) -> None:
    """A run killed with its sweep releases its folder a moment later (its kernel notices its
    parent is gone within a second or two): wait for that rather than fail with "in use"."""
    from workbench.engine.run_folder import read_run

    deadline = time.monotonic() + patience_s
    while read_run(folder).status == "running" and time.monotonic() < deadline:
        time.sleep(0.5)
