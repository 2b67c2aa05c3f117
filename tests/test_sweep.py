"""workbench sweep: the grid, the plan's checks, one at a time on CPU, one per (fake) GPU at
once, failures collected, finished combinations skipped, a kill -9 of the sweep resumed,
and the Slurm array script (shellcheck, and run through sbatch/srun stand-ins).

The notebook is tests/fixtures/sweep/steps.ipynb: a training stand-in without torch that
holds its folder's lock, writes events.jsonl like fit, and resumes from its "checkpoint",
so each combination costs a kernel start, not a training run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.engine.runs import runs
from workbench.errors import ConfigError, OutputDirLockedError
from workbench.sweep import grid, runner, slurm
from workbench.sweep.plan import Plan, read_status, write_status

NOTEBOOK = Path(__file__).parent / "fixtures" / "sweep" / "steps.ipynb"
QUIET = dict(log=lambda line: None)


def _sweep_log(folder: Path) -> str:
    """The combination's own log (the kernel's output), for an assertion's message."""
    log = folder / "sweep.log"
    return f"\n--- {log}:\n" + log.read_text()[-4000:] if log.is_file() else f"\n(no {log})"


def _slots(folder: Path) -> list[dict]:
    """One dict per execution of the notebook's training cell: device, start, resumed_from (, end)."""
    slots = []
    for line in (folder / "slot.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if "start" in entry:
            slots.append(entry)
        else:
            slots[-1].update(entry)
    return slots


# -- the grid and the plan --------------------------------------------------------------


def test_grid_values_are_yaml_scalars_and_names_are_stable():
    parsed = grid.parse_grid(["learning_rate=1e-5,2e-5", "seed=1,2", "model=a/b"])
    assert parsed == {"learning_rate": [1e-5, 2e-5], "seed": [1, 2], "model": ["a/b"]}
    names = [c.name for c in grid.combinations(parsed)]
    assert names[:2] == ["learning_rate=1e-05,seed=1,model=a_b", "learning_rate=1e-05,seed=2,model=a_b"]
    assert len(names) == 4
    with pytest.raises(ConfigError, match="NAME=VALUE1"):
        grid.parse_grid(["learning_rate"])
    with pytest.raises(ConfigError, match="given twice"):
        grid.parse_grid(["seed=1", "seed=2"])


def test_a_grid_key_the_notebook_does_not_declare_is_refused_with_the_names(tmp_path):
    with pytest.raises(ConfigError) as info:
        runner.make_plan(NOTEBOOK, {"lr": [1, 2]}, outputs=tmp_path)
    assert "learning_rate" in str(info.value) and "seed" in str(info.value)


def test_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert runner.resolve_devices("auto") == [None]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert runner.resolve_devices("auto") == ["2", "3"]
    assert runner.resolve_devices("0,1") == ["0", "1"] and runner.resolve_devices(["5"]) == ["5"]
    assert runner.resolve_devices("cpu") == [None]
    with pytest.raises(ConfigError):
        runner.resolve_devices("0,0")


# -- running here --------------------------------------------------------------------------


def test_cpu_sweep_runs_one_at_a_time_collects_failures_and_skips_finished(tmp_path):
    lines = []
    result = runner.sweep(NOTEBOOK, ["fail=false,true"], parameters={"steps": 2}, name="s", outputs=tmp_path,
                          devices="cpu", log=lines.append)
    assert [o.status for o in result.outcomes] == ["completed", "failed"]
    assert "asked to fail" in result.failed[0].error and "ValueError" in result.failed[0].error
    assert any("one at a time" in line and "slow each other" in line for line in lines)
    ok, bad = tmp_path / "s" / "fail=False", tmp_path / "s" / "fail=True"
    assert (ok / "steps.ipynb").is_file() and (bad / "steps.ipynb").is_file()  # the executed notebooks
    first, second = _slots(ok)[0], _slots(bad)[0]
    assert first["end"] <= second["start"]  # not at the same time
    assert first["device"] is None or first["device"] == os.environ.get("CUDA_VISIBLE_DEVICES")
    table = runs(tmp_path / "s")
    assert {r.name: r.status for r in table} == {"fail=False": "completed", "fail=True": "failed"}

    again = runner.sweep(NOTEBOOK, ["fail=false,true"], parameters={"steps": 2}, name="s", outputs=tmp_path,
                         devices="cpu", **QUIET)
    assert [o.status for o in again.outcomes] == ["skipped", "failed"]
    assert len(_slots(ok)) == 1 and len(_slots(bad)) == 2  # the finished one did not run again
    assert read_status(bad)["status"] == "failed"


def test_fake_gpus_run_combinations_at_once_one_device_each(tmp_path):
    result = runner.sweep(NOTEBOOK, {"seed": [1, 2]}, parameters={"steps": 4, "step_s": 1.0}, name="g",
                          outputs=tmp_path, devices=["0", "1"], **QUIET)
    assert [o.status for o in result.outcomes] == ["completed", "completed"]
    a, b = (_slots(tmp_path / "g" / f"seed={s}")[0] for s in (1, 2))
    assert {a["device"], b["device"]} == {"0", "1"}
    assert a["start"] < b["end"] and b["start"] < a["end"]  # they overlapped
    assert {o.device for o in result.outcomes} == {"0", "1"}


@pytest.mark.slow  # two sweeps of two kernels each: ~50 s on two busy cores
def test_kill_9_of_the_sweep_then_the_same_command_resumes(tmp_path):
    command = [sys.executable, "-m", "workbench", "sweep", str(NOTEBOOK), "--grid", "seed=1,2", "--param", "steps=12",
               "--param", "step_s=0.25", "--name", "k", "--outputs", str(tmp_path), "--gpus", "cpu"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    second = tmp_path / "k" / "seed=2"
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:  # wait until the second combination is part-way
            checkpoint = second / "checkpoint.json"
            if checkpoint.exists() and json.loads(checkpoint.read_text() or '{"step": 0}')["step"] >= 2:
                break
            assert proc.poll() is None, "the sweep ended before it could be killed"
            time.sleep(0.1)
        else:
            pytest.fail("the second combination never started")
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert read_status(tmp_path / "k" / "seed=1")["status"] == "completed"
    assert read_status(second)["status"] == "running"  # as the kill left it
    # The orphaned kernel follows its worker out within a few seconds: the folder is freed.
    deadline = time.monotonic() + 30
    while runs(tmp_path / "k")["seed=2"].status == "running" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert runs(tmp_path / "k")["seed=2"].status == "interrupted"

    again = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert again.returncode == 0, again.stdout + again.stderr + _sweep_log(second)
    assert len(_slots(tmp_path / "k" / "seed=1")) == 1  # finished: skipped
    killed, resumed = _slots(second)
    assert "end" not in killed
    assert resumed["resumed_from"] >= 2 and "end" in resumed
    assert read_status(second)["status"] == "completed"
    assert runs(tmp_path / "k")["seed=2"].step == 12


# -- Slurm -----------------------------------------------------------------------------------


def _stand_ins(bin_dir: Path) -> None:
    bin_dir.mkdir()
    # srun: drop its own --options and run the command here (as in tests/test_cluster_manifests.py).
    (bin_dir / "srun").write_text('#!/usr/bin/env bash\nwhile [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n')
    # sbatch: run every task of the script's --array here, one after the other, like a tiny cluster.
    (bin_dir / "sbatch").write_text(
        '#!/usr/bin/env bash\n'
        'while [ "${1#--}" != "$1" ]; do shift; done\n'
        'script=$1\n'
        'range=$(sed -n "s/^#SBATCH --array=\\([0-9]*-[0-9]*\\).*/\\1/p" "$script")\n'
        'for i in $(seq "${range%-*}" "${range#*-}"); do\n'
        '  SLURM_ARRAY_TASK_ID=$i SLURM_ARRAY_JOB_ID=4242 SLURM_CPUS_PER_TASK=1 bash "$script" '
        '>"$(dirname "$script")/slurm-4242_$i.out" 2>&1 || exit 1\n'
        'done\n'
        'echo 4242\n')
    for tool in ("srun", "sbatch"):
        (bin_dir / tool).chmod(0o755)


def test_slurm_array_script_passes_shellcheck(tmp_path, capsys):
    code = main(["sweep", str(NOTEBOOK), "--grid", "seed=1,2,3", "--name", "arr", "--outputs", str(tmp_path),
                 "--slurm", "--slurm-max-parallel", "2", "--slurm-gpus", "1"])
    assert code == 0
    script = tmp_path / "arr" / slurm.SCRIPT
    assert f"sbatch {script}" in capsys.readouterr().out
    text = script.read_text()
    assert "#SBATCH --array=0-2%2" in text and "#SBATCH --requeue" in text and "--gpus-per-task=1" in text
    assert 'srun "$python" -c "$launch" workbench.sweep.slurm "$plan" "$index"' in text
    shellcheck = Path(sys.executable).with_name("shellcheck")
    proc = subprocess.run([str(shellcheck), "--shell=bash", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not list((tmp_path / "arr").glob("seed=*"))  # written, not run


@pytest.mark.slow  # two kernels through the stand-ins: ~30 s on two busy cores
def test_slurm_array_job_runs_each_combination_through_sbatch_and_srun(tmp_path, monkeypatch, capsys):
    _stand_ins(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("PYTHON", sys.executable)
    code = main(["sweep", str(NOTEBOOK), "--grid", "seed=1,2", "--param", "steps=2", "--name", "arr", "--outputs",
                 str(tmp_path), "--slurm", "--submit"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "submitted job 4242" in out
    for seed in (1, 2):
        folder = tmp_path / "arr" / f"seed={seed}"
        log = (tmp_path / "arr" / f"slurm-4242_{seed - 1}.out").read_text()
        assert read_status(folder)["status"] == "completed", log
        assert f"combination {seed - 1} on" in log
    assert {r.status for r in runs(tmp_path / "arr")} == {"completed"}
    assert len(Plan.load(tmp_path / "arr").combinations) == 2


# -- one sweep per folder ------------------------------------------------------------------

HOLD_SWEEP = """
import sys
from workbench.engine import run_lock
from workbench.sweep import runner
lock = run_lock.acquire(sys.argv[1], lock_file=runner.LOCK_FILE, kind="sweep")
print("held", flush=True)
sys.stdin.read()
"""


def test_a_second_sweep_on_the_same_folder_is_refused_naming_the_first(tmp_path, capsys):
    root = tmp_path / "one"
    first = subprocess.Popen([sys.executable, "-c", HOLD_SWEEP, str(root)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "held"
        with pytest.raises(OutputDirLockedError) as err:
            runner.sweep(NOTEBOOK, ["seed=1,2"], parameters={"steps": 2}, name="one", outputs=tmp_path,
                         devices="cpu", **QUIET)
        assert f"{root} is in use by another sweep: process {first.pid} on host" in str(err.value)
        assert err.value.holder["pid"] == first.pid and "another --name" in err.value.fix
        assert sorted(p.name for p in root.iterdir()) == [runner.LOCK_FILE]  # nothing written, not even the plan
        code = main(["sweep", str(NOTEBOOK), "--grid", "seed=1,2", "--param", "steps=2", "--name", "one",
                     "--outputs", str(tmp_path), "--gpus", "cpu"])
        assert code == 2 and f"in use by another sweep: process {first.pid}" in capsys.readouterr().err
    finally:
        first.stdin.close()
        first.wait()
    result = runner.sweep(NOTEBOOK, ["seed=1"], parameters={"steps": 2}, name="one", outputs=tmp_path,
                          devices="cpu", **QUIET)  # the first one gone (killed, here): the folder is free
    assert [o.status for o in result.outcomes] == ["completed"]


def test_a_sweep_here_and_a_slurm_array_on_one_folder_exclude_each_other(tmp_path):
    plan = runner.make_plan(NOTEBOOK, {"seed": [1]}, parameters={"steps": 2}, outputs=tmp_path, name="mix")
    with (runner.hold(plan, shared=True), runner.hold(plan, shared=True),  # two array tasks at once
          pytest.raises(OutputDirLockedError, match="its Slurm array tasks")):
        runner.run_plan(plan, devices="cpu", **QUIET)
    with runner.hold(plan), pytest.raises(OutputDirLockedError, match="in use by another sweep: process"):
        runner.run_plan(plan, devices=runner.INHERIT, **QUIET)


def test_a_completed_status_is_never_replaced(tmp_path):
    """A runner that lost a race (its run found the folder in use) reports failed after the winner's completed."""
    folder = tmp_path / "seed=1"
    write_status(folder, "completed", seconds=3.0)
    assert write_status(folder, "failed", error="OutputDirLockedError: ...")["status"] == "completed"
    assert write_status(folder, "running")["status"] == "completed"
    assert read_status(folder)["status"] == "completed" and read_status(folder)["seconds"] == 3.0


def test_a_task_index_outside_the_plan_is_refused(tmp_path):
    plan = runner.make_plan(NOTEBOOK, {"seed": [1]}, outputs=tmp_path, name="x")
    plan.save()
    assert slurm.main([str(plan.root_path / "sweep.json"), "3"]) == 2


def test_from_a_notebook_the_sweeps_table_is_shown_and_refreshed(tmp_path, monkeypatch):
    import IPython.display

    from workbench import frontend
    from workbench.widgets.runs import RunsBrowser

    shown = []
    monkeypatch.setattr(IPython.display, "display", shown.append)
    result = frontend.sweep(NOTEBOOK, {"seed": [1]}, mode="notebook", name="nb", outputs=tmp_path, devices="cpu",
                            parameters={"steps": 2}, log=lambda line: None)
    assert [o.status for o in result.outcomes] == ["completed"]
    (browser,) = shown
    assert isinstance(browser, RunsBrowser)
    assert [r.status for r in browser.table] == ["completed"]  # re-read when the run ended
    browser.close()
