"""``workbench sweep NOTEBOOK --grid k=v1,v2 ...``: the options map one to one onto ``runner.sweep``."""

from __future__ import annotations

import argparse

from workbench.sweep import grid as grids


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("notebook", metavar="NOTEBOOK", help="the notebook to run (it needs a `parameters` cell)")
    parser.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2",
                        help="a parameter and its values; repeat for more (every combination runs)")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                        help="a parameter with the same value in every combination")
    parser.add_argument("--name", help="the sweep's folder under --outputs (default: NOTEBOOK-sweep)")
    parser.add_argument("--outputs", default="outputs", metavar="DIR", help="where the sweep's folder goes "
                        "(default: outputs)")
    parser.add_argument("--gpus", default="auto", metavar="IDS",
                        help="auto (the visible GPUs; none: one at a time on the CPU), cpu, or ids like 0,1")
    parser.add_argument("--kernel", default="python3", help="the Jupyter kernel (default python3: this Python)")
    parser.add_argument("--cell-timeout", type=int, default=None, metavar="S", help="fail a cell after S seconds")
    slurm = parser.add_argument_group("Slurm")
    slurm.add_argument("--slurm", action="store_true", help="write an array job script instead of running here")
    slurm.add_argument("--submit", action="store_true", help="with --slurm: submit it with sbatch")
    slurm.add_argument("--slurm-time", default="04:00:00", metavar="HH:MM:SS", help="time limit per combination")
    slurm.add_argument("--slurm-gpus", type=int, default=1, metavar="N", help="GPUs per combination (0: CPU)")
    slurm.add_argument("--slurm-cpus", type=int, default=8, metavar="N", help="CPUs per combination")
    slurm.add_argument("--slurm-max-parallel", type=int, default=None, metavar="N",
                       help="at most N combinations at once (the array's %%N)")


def run_cli(args: argparse.Namespace) -> int:
    """0 when every combination completed (or was done before), 1 when some failed."""
    from workbench.sweep import runner

    plan = runner.make_plan(args.notebook, grids.parse_grid(args.grid), name=args.name, outputs=args.outputs,
                            parameters=grids.parse_parameters(args.param), kernel=args.kernel,
                            cell_timeout_s=args.cell_timeout)
    if args.slurm:
        from workbench.sweep import slurm

        with runner.hold(plan):  # not while a sweep runs here: its plan would change under it
            plan.save()
            script = slurm.write_script(plan, time_limit=args.slurm_time, gpus_per_task=args.slurm_gpus,
                                        cpus_per_task=args.slurm_cpus, max_parallel=args.slurm_max_parallel)
        print(f"wrote {script} ({len(plan.combinations)} array tasks)")
        if args.submit:
            print(f"submitted job {slurm.submit(script)}; follow it with `workbench runs {plan.root}`")
        else:
            print(f"submit it with: sbatch {script}")
        return 0
    if args.submit:
        print("workbench sweep: --submit needs --slurm", flush=True)
        return 2
    result = runner.run_plan(plan, devices=args.gpus, log=lambda line: print(line, flush=True))
    print(result.summary())
    print()
    print(result.runs().format())
    return 1 if result.failed else 0
