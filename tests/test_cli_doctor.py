"""`workbench doctor` as a user runs it: a real subprocess of the installed console script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WORKBENCH = Path(sys.executable).with_name("workbench")

RESULT_KEYS = {"section", "name", "level", "message", "fix"}
FACT_KEYS = {"python", "packages", "torch", "nvml", "gpus", "shm", "cpu", "container", "output_dir",
             "huggingface", "jupyter"}


def run_doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}  # never wait on the network
    return subprocess.run([str(WORKBENCH), "doctor", *args], capture_output=True, text=True,
                          env=full_env, cwd=REPO, timeout=120)


@pytest.fixture(scope="module")
def json_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("doctor") / "outputs"
    done = run_doctor("--json", "--output-dir", str(out))
    return done, json.loads(done.stdout), out


def test_json_output_follows_the_documented_schema(json_run):
    done, data, _ = json_run
    assert done.returncode == (0 if data["ok"] else 1), done.stderr
    assert data["version"] == 1 and isinstance(data["ok"], bool)
    assert set(data["facts"]) == FACT_KEYS
    names = [r["name"] for r in data["results"]]
    assert len(names) == len(set(names))
    for result in data["results"]:
        assert set(result) == RESULT_KEYS
        assert result["level"] in ("ok", "warn", "error")
        assert result["message"]
        if result["level"] != "ok":
            assert result["fix"], f"{result['name']} has no fix"
    levels = [r["level"] for r in data["results"]]
    assert data["counts"] == {lvl: levels.count(lvl) for lvl in ("ok", "warn", "error")}
    assert data["ok"] == ("error" not in levels)


def test_json_run_on_this_machine_exits_0_and_names_the_missing_driver(json_run):
    done, data, out = json_run
    by_name = {r["name"]: r for r in data["results"]}
    assert data["facts"]["output_dir"]["path"] == str(out)
    assert by_name["python"]["message"].startswith("Python ")
    assert by_name["hf hub reachable"]["message"].startswith("skipped")
    if data["facts"]["nvml"]["available"]:
        pytest.skip("this machine has an NVIDIA driver")
    assert done.returncode == 0, done.stdout + done.stderr
    driver = by_name["nvidia driver"]
    assert driver["level"] == "warn"
    assert driver["message"].startswith("no NVIDIA driver: ")
    assert data["facts"]["nvml"]["reason"] in driver["message"]


def test_human_table_and_exit_status_1_on_an_error(tmp_path):
    blocker = tmp_path / "outputs"
    blocker.write_text("a file where the checkpoint folder should be")
    # The default output dir comes from WORKBENCH_OUTPUT_DIR.
    done = run_doctor("--no-network", env={"WORKBENCH_OUTPUT_DIR": str(blocker / "run")})
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["LEVEL", "CHECK", "RESULT"]
    for name in ("nvidia driver", "shared memory", "jupyter auth", "torch build"):
        assert any(name in line for line in lines), name
    (row,) = [i for i, line in enumerate(lines) if line.startswith("ERROR  output dir")]
    block = [lines[row]]
    for line in lines[row + 1 :]:  # continuation lines are indented
        if not line.startswith(" "):
            break
        block.append(line.strip())
    assert str(blocker) in " ".join(block)  # paths are never split
    assert any(line.startswith("fix: ") for line in block)
    assert not any("hf hub reachable" in line for line in lines)  # --no-network
    assert "problems found" in lines[-1]
