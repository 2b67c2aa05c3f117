"""The sweep as a Slurm array job: ``workbench sweep NB --grid ... --slurm [--submit]``.

``write_script`` writes ``<root>/sweep.slurm``: one array task per combination, each running
``python -m workbench.sweep.slurm <root>/sweep.json <index>`` (without the working folder on
sys.path: ``server/processes.py``'s ``MODULE_LAUNCHER``), which executes that one
combination exactly as ``workbench sweep`` does on one machine (same folder, same status
file), with the GPU Slurm gives the task. The conventions of ``environment/cluster/train.slurm``
hold: ``PYTHON`` names the nodes' interpreter, ``--requeue`` puts a task whose node was lost
back in the queue, one OpenMP thread per CPU Slurm gives, and the output folder must be on a
file system the nodes share. A requeued or re-submitted task skips a completed combination
and resumes an interrupted one from its checkpoints.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from workbench.errors import ConfigError, WorkbenchError
from workbench.script_values import comment_text, directive_value, shell_word
from workbench.server.processes import MODULE_LAUNCHER
from workbench.sweep.plan import PLAN_FILE, Plan

SCRIPT = "sweep.slurm"


def write_script(plan: Plan, *, time_limit: str = "04:00:00", gpus_per_task: int = 1, cpus_per_task: int = 8,
                 max_parallel: int | None = None, python: str | None = None) -> Path:
    """Write the array job script beside the plan (the plan must be saved); returns its path.

    Every value goes into the script through ``workbench.script_values``: bash words quoted,
    ``#SBATCH`` values plain words or refused, comments with unprintable characters escaped
    (a notebook's file name may hold a line break: it comes from a folder others can write).
    """
    count = len(plan.combinations)
    root = plan.root_path
    directives = [
        f"--job-name={directive_value('the sweep name', plan.name)}",
        f"--array=0-{count - 1}" + (f"%{_count('--slurm-max-parallel', max_parallel)}" if max_parallel else ""),
        "--ntasks=1",
        *([f"--gpus-per-task={_count('--slurm-gpus', gpus_per_task)}"] if gpus_per_task else []),
        f"--cpus-per-task={_count('--slurm-cpus', cpus_per_task)}",
        f"--time={_time_limit(time_limit)}",
        "--requeue",
        # %A_%a: Slurm's job and task ids; the folder itself may hold no % (nor spaces).
        f"--output={directive_value('the sweep folder (--outputs, --name)', str(root))}/slurm-%A_%a.out",
    ]
    lines = [
        "#!/usr/bin/env bash",
        f"# Sweep {comment_text(plan.name)}: {count} combinations of {comment_text(Path(plan.notebook).name)}, "
        "one per array task.",
        f"# Written by `workbench sweep --slurm`; submit with: sbatch {comment_text(shlex.quote(str(root / SCRIPT)))}",
        "# Each task executes one combination into its folder under the sweep's root, as",
        "# `workbench sweep` does on one machine; a requeued task resumes from its checkpoints.",
        "# The root must be on a file system every node mounts (the same path everywhere).",
        "#",
        *(f"#SBATCH {d}" for d in directives),
        "set -euo pipefail",
        "",
        "# The Python that has workbench installed on the nodes (PYTHON=/shared/envs/workbench/bin/python).",
        f"python=${{PYTHON:-{shell_word('the nodes Python (PYTHON)', python or 'python3')}}}",
        f"sweep={shell_word('the sweep name', plan.name)}",
        f"plan={shell_word('the sweep folder (--outputs, --name)', str(root / PLAN_FILE))}",
        "# `python -m` without the working folder on sys.path (the nodes' Python may lack -P).",
        f"launch={shell_word('the launcher', MODULE_LAUNCHER)}",
        'index=${SLURM_ARRAY_TASK_ID:?submit this script with sbatch: it is an array job}',
        "# One OpenMP thread per CPU the task was given: tokenization and the loader have their own.",
        'export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}',
        "export TOKENIZERS_PARALLELISM=false",
        "",
        'echo "workbench sweep $sweep: combination $index on $(hostname)"',
        'srun "$python" -c "$launch" workbench.sweep.slurm "$plan" "$index"',
        "",
    ]
    path = root / SCRIPT
    path.write_text("\n".join(lines), encoding="utf-8")
    path.chmod(0o755)
    return path


# Slurm's --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or no limit.
_TIME_LIMIT = re.compile(r"(\d+-)?\d+(:\d+){0,2}|UNLIMITED|INFINITE", re.IGNORECASE)


def _time_limit(value: str) -> str:
    if not isinstance(value, str) or not _TIME_LIMIT.fullmatch(value):
        raise ConfigError("--slurm-time", value, "a Slurm time limit: MINUTES, HH:MM:SS or D-HH:MM:SS",
                          fix="e.g. --slurm-time 04:00:00 (four hours) or 2-00:00:00 (two days).")
    return value


def _count(field: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(field, value, "a whole number of at least 1")
    return value


def submit(script: Path, sbatch: str = "sbatch") -> str:
    """``sbatch --parsable SCRIPT``; returns the job id."""
    try:
        proc = subprocess.run([sbatch, "--parsable", str(script)], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise WorkbenchError("sbatch is not on PATH: this machine cannot submit Slurm jobs.",
                             f"copy {script} to a login node and run `sbatch {script}` there.") from None
    if proc.returncode != 0:
        raise WorkbenchError(f"sbatch refused {script}: {proc.stderr.strip() or proc.stdout.strip()}",
                             "read Slurm's message; adjust --slurm-time / --slurm-gpus / --slurm-cpus to your "
                             "cluster's limits, or edit the script and submit it yourself.")
    return proc.stdout.strip().split(";")[0]


def main(argv: list[str]) -> int:
    """One array task: ``python -m workbench.sweep.slurm PLAN INDEX``."""
    from workbench.sweep.runner import INHERIT, run_plan

    if len(argv) != 2 or not argv[1].isdigit():
        print("usage: python -m workbench.sweep.slurm SWEEP.json INDEX", file=sys.stderr)
        return 2
    plan = Plan.load(argv[0])
    index = int(argv[1])
    if index >= len(plan.combinations):
        print(f"workbench sweep: no combination {index}: the plan has {len(plan.combinations)}", file=sys.stderr)
        return 2
    result = run_plan(plan, devices=INHERIT, indexes=[index], log=lambda line: print(line, flush=True))
    return 1 if result.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
