"""workbench.runs / `workbench runs`: the table of real run folders made by tiny fits
(completed, interrupted, failed, running, LoRA beside classification) and of broken ones
(a truncated events.jsonl, checkpoints without run.json, a folder with no log), and the
notebook widget (filter, sort, overlaid curves, a running run followed live)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time

import pytest
import torch

from workbench import frontend
from workbench.cli import main
from workbench.engine import run_lock, runs
from workbench.engine import train as engine_train
from workbench.errors import TrainingError, WorkbenchError
from workbench.sources.synthetic import make_dataset
from workbench.sources.synthetic_llm import make_chat_dataset
from workbench.tasks.classification import ClassificationTask

QUICK = dict(batch_size=8, num_workers=0, max_length=64, log_every=1, warmup_ratio=0.0, eval_every=2)


@pytest.fixture(scope="module")
def outputs(tiny_bert, tiny_llama_dir, tmp_path_factory):
    """outputs/ with one run of each kind, made by real fits; returns (root, seen while running)."""
    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("table") / "outputs"
    data = make_dataset(48, 16, seed=3)
    fit = engine_train.fit
    fit(str(tiny_bert), data, output_dir=str(root / "cls-a"), learning_rate=2e-3, max_steps=4, **QUICK)

    seen = {}

    def look_while_running(event):  # the run holds its lock: the table must say "running"
        if event["kind"] == "train" and event["step"] == 2:
            row = runs.runs(root)["cls-b"]
            seen["status"], seen["problem"] = row.status, row.problem

    fit(str(tiny_bert), data, output_dir=str(root / "cls-b"), learning_rate=1e-3, max_steps=4,
        listeners=[look_while_running], **QUICK)

    def stop_at_3(event):
        if event["kind"] == "train" and event["step"] == 3:
            raise KeyboardInterrupt

    result = fit(str(tiny_bert), data, output_dir=str(root / "stopped"), learning_rate=2e-3, max_steps=6,
                 listeners=[stop_at_3], **QUICK)
    assert result.status == "interrupted"

    original = ClassificationTask.loss
    calls = {"n": 0}

    def nan_at_3(self, model, batch):
        calls["n"] += model.training  # training steps only, not the divergence guard's start
        loss = original(self, model, batch)
        return loss * float("nan") if calls["n"] == 3 else loss

    with pytest.MonkeyPatch.context() as mp, pytest.raises(TrainingError):
        mp.setattr(ClassificationTask, "loss", nan_at_3)
        fit(str(tiny_bert), data, output_dir=str(root / "nan"), learning_rate=2e-3, max_steps=6, **QUICK)

    fit(str(tiny_llama_dir), make_chat_dataset(16, 8), output_dir=str(root / "llm" / "lora"), task="causal_lm",
        finetune="lora", lora_r=4, lora_alpha=8, max_steps=2, batch_size=4, max_length=256, num_workers=0,
        log_every=1, warmup_ratio=0.0, eval_every=2, learning_rate=1e-3)

    # Broken copies of a completed run.
    shutil.copytree(root / "cls-a", root / "broken" / "truncated")
    log = root / "broken" / "truncated" / "events.jsonl"
    data_bytes = log.read_bytes()
    log.write_bytes(data_bytes[: int(len(data_bytes) * 0.6)])  # a kill in the middle of a line
    shutil.copytree(root / "cls-a", root / "broken" / "no-record")
    for record in (root / "broken" / "no-record" / "checkpoints").glob("*/run.json"):
        record.unlink()
    (root / "broken" / "no-log" / "checkpoints").mkdir(parents=True)
    (root / "broken" / "garbage").mkdir()
    (root / "broken" / "garbage" / "events.jsonl").write_bytes(b"\x00\xffnot json\n{\"half\": ")
    return root, seen


def test_every_kind_of_run_has_its_status(outputs):
    root, seen = outputs
    table = runs.runs(root)
    status = {r.name: r.status for r in table}
    assert status == {
        "cls-a": "completed", "cls-b": "completed", "stopped": "interrupted", "nan": "failed",
        "llm/lora": "completed", "broken/truncated": "interrupted", "broken/no-record": "completed",
        "broken/no-log": "broken", "broken/garbage": "broken",
    }
    assert seen == {"status": "running", "problem": None}  # no "stopped without an end event" beside it
    assert "half-written" in table["broken/truncated"].problem
    # 4 steps of a fresh tiny BERT learn nothing: the completed classifiers say so, the others have no verdict.
    assert table["cls-a"].verdict == "LEARNED NOTHING" and "Learned nothing: eval_accuracy" in table["cls-a"].problem
    assert table["nan"].verdict is None and table["stopped"].verdict is None
    assert "no events.jsonl" in table["broken/no-log"].problem
    assert "no start event" in table["broken/garbage"].problem


def test_rows_hold_steps_best_metric_throughput_and_the_model(outputs, tiny_bert, tiny_llama_dir):
    root, _ = outputs
    table = runs.runs(root)
    a, lora, stopped, nan = table["cls-a"], table["llm/lora"], table["stopped"], table["nan"]
    assert (a.task, a.model, a.step, a.total_steps) == ("classification", str(tiny_bert), 4, 4)
    assert a.best_metric == "eval_accuracy" and a.best_step in (2, 4)
    assert a.best_value == max(e["eval_accuracy"] for e in a.history().evals)
    assert set(a.metrics) == {"eval_loss", "eval_accuracy", "eval_f1"}
    assert a.samples_per_s > 0 and a.duration_s > 0 and a.peak_gpu_mem_bytes is None  # CPU: not recorded
    assert (lora.task, lora.model, lora.best_metric) == ("causal_lm", str(tiny_llama_dir), "eval_loss")
    assert (stopped.step, stopped.total_steps) == (3, 6)
    assert nan.step == 3
    assert table["broken/no-record"].model == str(tiny_bert)  # from the start event


def test_only_the_settings_that_differ_are_columns(outputs):
    root, _ = outputs
    table = runs.runs(root)
    differ = table.differing_settings()
    assert {"learning_rate", "task", "max_steps", "lora_r"} <= set(differ)
    assert "output_dir" not in differ and "seed" not in differ and "log_every" not in differ
    two = [table["cls-a"], table["cls-b"]]
    assert table.differing_settings(two) == ["learning_rate"]
    frame = table.to_frame()
    assert frame.loc["cls-a", "learning_rate"] == 2e-3 and frame.loc["cls-b", "learning_rate"] == 1e-3
    assert frame.loc["nan", "status"] == "failed"
    assert "eval_accuracy" in frame.columns and "eval_loss" in frame.columns


def test_precision_column_says_what_ran_and_why(outputs, tmp_path):
    root, _ = outputs
    first = json.loads((root / "cls-a" / "events.jsonl").read_text().splitlines()[0])
    ran, why = first["precision"], first["precision_reason"]  # bf16 on a CPU with AVX512-BF16, else fp32
    assert why.startswith(f"auto: {ran}, ")
    a = runs.runs(root)["cls-a"]
    assert (a.precision, a.precision_reason) == (f"{ran} (auto)", why)
    # The same run asked for fp32 explicitly; and a log from before the reason was written.
    for name, setting, reason in (("asked", "fp32", "asked for: fp32"), ("old", "auto", None)):
        shutil.copytree(root / "cls-a", tmp_path / name)
        log = tmp_path / name / "events.jsonl"
        lines = log.read_text().splitlines()
        start = {k: v for k, v in json.loads(lines[0]).items() if k != "precision_reason"}
        start.update(precision="fp32", **({"precision_reason": reason} if reason else {}))
        start["config"]["precision"] = setting
        log.write_text("\n".join([json.dumps(start), *lines[1:]]) + "\n")
    table = runs.runs(tmp_path)
    assert (table["asked"].precision, table["asked"].precision_reason) == ("fp32", "asked for: fp32")
    assert (table["old"].precision, table["old"].precision_reason) == ("fp32 (auto)", None)
    # The setting ("auto" vs "fp32") is not a column of its own: it would overwrite what ran.
    assert "precision" not in table.differing_settings()
    rows = {r["name"]: r for r in table.rows()}
    assert rows["asked"]["precision"] == "fp32" and rows["asked"]["precision_reason"] == "asked for: fp32"
    header = table.format().splitlines()[0].split()
    assert "precision" in header and "precision_reason" not in header  # a sentence: CSV and DataFrame only
    assert table.to_frame().loc["asked", "precision_reason"] == "asked for: fp32"


def test_a_held_lock_means_running_and_a_dead_holder_does_not(outputs, tmp_path):
    root, _ = outputs
    folder = tmp_path / "live"
    shutil.copytree(root / "stopped", folder)
    lock = run_lock.acquire(folder)
    try:
        assert runs.read_run(folder).status == "running"
    finally:
        lock.release()
    assert runs.read_run(folder).status == "interrupted"
    # A lock file left by a killed process (pid gone) is not a running run.
    (folder / run_lock.LOCK_FILE).write_text(json.dumps({"pid": 2**22 + 7, "host": socket.gethostname()}))
    assert runs.read_run(folder).status == "interrupted"


def _unended_run(folder, host: str, silent_s: float = 0.0):
    """A run folder whose last part started on ``host`` and never ended, its lock file left behind
    (as kill -9 leaves it) naming a process that nobody holds the lock for."""
    folder.mkdir(parents=True)
    start = {"time": time.time() - 60, "kind": "start", "total_steps": 10, "config": {"task": "classification"},
             "pid": os.getpid(), "host": host}
    train = {"time": time.time() - 30, "kind": "train", "step": 3, "loss": 0.6}
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in (start, train)))
    (folder / run_lock.LOCK_FILE).write_text(json.dumps({"pid": os.getpid(), "host": host}))
    then = time.time() - silent_s
    os.utime(folder / "events.jsonl", (then, then))
    return folder


def test_a_reused_pid_never_makes_a_dead_run_look_alive(tmp_path):
    """The lock file names this very process (alive: a PID reused after a kill -9, or a small PID
    handed out again in a restarted container), but no one holds the lock: the run is dead."""
    folder = _unended_run(tmp_path / "killed", socket.gethostname())
    row = runs.read_run(folder)
    assert row.status == "interrupted"
    assert row.problem.startswith("stopped without an end event")


def test_a_running_run_has_no_note_that_contradicts_it(tmp_path):
    folder = _unended_run(tmp_path / "live", socket.gethostname())
    (folder / run_lock.LOCK_FILE).unlink()
    with run_lock.acquire(folder):
        row = runs.read_run(folder)
        assert row.status == "running" and row.problem is None, row.problem
    table = runs.runs(tmp_path)
    assert table["live"].status == "interrupted" and "stopped without an end event" in table["live"].problem


def test_a_lock_that_cannot_be_checked_is_said_so_and_never_hangs_the_table(tmp_path):
    folder = _unended_run(tmp_path / "odd", socket.gethostname())
    (folder / run_lock.LOCK_FILE).unlink()
    os.mkfifo(folder / run_lock.LOCK_FILE)  # a read of it would wait forever for a writer
    row = runs.read_run(folder)  # no run's folder: broken, and why (tests/test_hostile_run_folders.py: the rest)
    assert row.status == "broken" and "cannot read .workbench.lock: it is a named pipe" in row.problem


def test_a_run_whose_host_is_gone_is_lost_after_the_stated_time(tmp_path):
    fresh = _unended_run(tmp_path / "fresh", "gpu-node-7", silent_s=30)
    row = runs.read_run(fresh)  # its lock may be invisible from here (no shared locks): running, said why
    assert row.status == "running" and "on host gpu-node-7" in row.problem and "lost after 10m00s" in row.problem
    silent = _unended_run(tmp_path / "silent", "gpu-node-7", silent_s=runs.LOST_AFTER_S + 60)
    row = runs.read_run(silent)
    assert row.status == "lost" and row.host == "gpu-node-7"
    assert row.problem.startswith("host gpu-node-7 cannot be reached: no lock held and no event for 11m00s")
    assert runs.read_run(silent, lost_after_s=3600).status == "running"  # the time is a setting
    assert "lost" in str(runs.runs(tmp_path).format())


def test_cli_prints_the_table_and_csv(outputs, capsys):
    root, _ = outputs
    assert main(["runs", str(root), "--sort", "best_value"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0].split()
    assert header[:4] == ["name", "status", "verdict", "task"] and "learning_rate" in header
    assert "broken/no-log: no events.jsonl" in out
    assert main(["runs", str(root), "--csv"]) == 0
    assert capsys.readouterr().out.startswith("name,status,")
    assert main(["runs", str(root / "nowhere")]) == 2


def test_a_log_in_another_json_layout_is_read_too(tmp_path):
    events = [{"time": 1.0, "kind": "start", "total_steps": 2, "config": {"task": "classification"}},
              {"time": 2.0, "kind": "train", "step": 2, "loss": 0.5},
              {"time": 3.0, "kind": "end", "status": "completed", "step": 2, "metrics": {"eval_loss": 0.4}}]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events))
    run = runs.read_run(tmp_path)
    assert (run.status, run.step, run.metrics, run.duration_s) == ("completed", 2, {"eval_loss": 0.4}, 2.0)


def test_missing_folder_says_where_it_looked(tmp_path):
    with pytest.raises(WorkbenchError, match="no folder"):
        runs.runs(tmp_path / "nowhere")


def test_frontend_returns_the_table_outside_a_notebook_and_the_widget_in_one(outputs):
    from workbench.widgets.runs import RunsBrowser

    root, _ = outputs
    table = frontend.runs(root, mode="console")
    assert isinstance(table, runs.RunsTable)
    assert "<table" in table._repr_html_()
    browser = frontend.runs(root, mode="notebook")
    assert isinstance(browser, RunsBrowser) and len(browser.to_frame()) == len(table)
    browser.close()


# -- the notebook widget ------------------------------------------------------------------


def test_widget_filters_sorts_and_overlays_the_selected_runs(outputs):
    from workbench.widgets.runs import RunsBrowser

    root, _ = outputs
    browser = RunsBrowser(runs.runs(root))
    browser.filter.value = "classification completed"
    assert {r["name"] for r in browser.visible_rows()} == {"cls-a", "cls-b", "broken/no-record"}
    browser.filter.value = ""
    browser.sort.value, browser.descending.value = "step", True
    steps = [r["step"] for r in browser.visible_rows()]
    assert steps == sorted(steps, reverse=True)
    assert "<table" in browser.grid.value and "learning_rate" in browser.grid.value
    browser.select.value = ("cls-a", "llm/lora")
    assert bytes(browser.chart.value).startswith(b"\x89PNG") and browser.redraws >= 1
    assert browser.to_frame().shape[0] == len(browser.table)
    browser.close()


def test_widget_follows_a_running_run_live(outputs, tmp_path):
    from workbench.widgets.runs import RunsBrowser

    root, _ = outputs
    folder = tmp_path / "outputs" / "live"
    shutil.copytree(root / "stopped", folder)
    log = folder / "events.jsonl"
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    log.write_text("".join(json.dumps(e) + "\n" for e in lines if e["kind"] != "end"))
    lock = run_lock.acquire(folder)
    browser = RunsBrowser(runs.runs(folder.parent), live_every_s=0.05)
    try:
        browser.select.value = ("live",)
        assert browser._live is not None and browser._live.is_alive()
        before = len(browser.table["live"].history().train_steps)
        with log.open("a") as f:
            f.write(json.dumps({"time": 1.0, "kind": "train", "step": 4, "loss": 0.5}) + "\n")
        assert browser.refresh_running()
        assert len(browser.table["live"].history().train_steps) == before + 1
        assert browser.table["live"].step == 4
    finally:
        lock.release()
    browser._live.join(timeout=60)  # one more re-read and redraw: seconds on busy cores
    assert not browser._live.is_alive()  # nothing selected is running any more: the thread ends
    assert browser.table["live"].status == "interrupted"
    browser.close()
