"""The sweep as a Slurm array job: ``workbench sweep NB --grid ... --slurm [--submit]``.

``write_script`` writes ``<root>/sweep.slurm``: one array task per combination, each running
``python -m workbench.sweep.slurm <root>/sweep.json <index>``, which executes that one
combination exactly as ``workbench sweep`` does on one machine (same folder, same status
file), with the GPU Slurm gives the task. The conventions of ``environment/cluster/train.slurm``
hold: ``PYTHON`` names the nodes' interpreter, ``--requeue`` puts a task whose node was lost
back in the queue, one OpenMP thread per CPU Slurm gives, and the output folder must be on a
file system the nodes share. A requeued or re-submitted task skips a completed combination
and resumes an interrupted one from its checkpoints.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.sweep.plan import Plan

SCRIPT = "sweep.slurm"


def write_script(plan: Plan, *, time_limit: str = "04:00:00", gpus_per_task: int = 1, cpus_per_task: int = 8,
                 max_parallel: int | None = None, python: str | None = None) -> Path:
    """Write the array job script beside the plan (the plan must be saved); returns its path."""
    count = len(plan.combinations)
    array = f"0-{count - 1}" + (f"%{max_parallel}" if max_parallel else "")
    root = plan.root_path
    if any(ord(c) < 32 for c in str(root)):
        raise WorkbenchError(f"The sweep root {root!r} cannot be written into a shell script.",
                             "use a plain folder name for --outputs and --name.")
    lines = [
        "#!/usr/bin/env bash",
        f"# Sweep {plan.name}: {count} combinations of {Path(plan.notebook).name}, one per array task.",
        f"# Written by `workbench sweep --slurm`; submit with: sbatch {shlex.quote(str(root / SCRIPT))}",
        "# Each task executes one combination into its folder under the sweep's root, as",
        "# `workbench sweep` does on one machine; a requeued task resumes from its checkpoints.",
        "# The root must be on a file system every node mounts (the same path everywhere).",
        "#",
        f"#SBATCH --job-name={plan.name}",
        f"#SBATCH --array={array}",
        "#SBATCH --ntasks=1",
        *([f"#SBATCH --gpus-per-task={gpus_per_task}"] if gpus_per_task else []),
        f"#SBATCH --cpus-per-task={cpus_per_task}",
        f"#SBATCH --time={time_limit}",
        "#SBATCH --requeue",
        f"#SBATCH --output={root}/slurm-%A_%a.out",
        "set -euo pipefail",
        "",
        "# The Python that has workbench installed on the nodes (PYTHON=/shared/envs/workbench/bin/python).",
        f"python=${{PYTHON:-{shlex.quote(python or 'python3')}}}",
        f"plan={shlex.quote(str(root / 'sweep.json'))}",
        'index=${SLURM_ARRAY_TASK_ID:?submit this script with sbatch: it is an array job}',
        "# One OpenMP thread per CPU the task was given: tokenization and the loader have their own.",
        'export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}',
        "export TOKENIZERS_PARALLELISM=false",
        "",
        f'echo "workbench sweep {plan.name}: combination $index on $(hostname)"',
        'srun "$python" -m workbench.sweep.slurm "$plan" "$index"',
        "",
    ]
    path = root / SCRIPT
    path.write_text("\n".join(lines), encoding="utf-8")
    path.chmod(0o755)
    return path


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
