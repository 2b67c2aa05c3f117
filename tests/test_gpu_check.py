"""scripts/gpu_check.sh on a machine without a GPU, and the report it assembles
(scripts/gpu_check_report.py) from the files a GPU run leaves.

Without CUDA the script must still write its one report, saying "no GPU" and why, with the
GPU parts skipped and the reason given; a part that fails is named and the next part runs;
only a report that cannot be written makes the exit status non-zero.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.sh"
sys.path.insert(0, str(REPO / "scripts"))
import gpu_check_report  # noqa: E402  (scripts/ is no package: the assembler is a plain script)

no_gpu_here = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the check would run it")


def gpu_check(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "--python", sys.executable, *args], capture_output=True,
                          text=True, cwd=REPO, timeout=timeout)


def test_the_script_passes_shellcheck():
    shellcheck = Path(sys.executable).with_name("shellcheck")
    if not shellcheck.exists():
        shellcheck = shutil.which("shellcheck")
    if not shellcheck:
        pytest.skip("shellcheck is not installed")
    proc = subprocess.run([str(shellcheck), "--shell=bash", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@no_gpu_here
def test_without_a_gpu_it_writes_a_report_that_says_so_and_skips_the_gpu_parts(tmp_path):
    done = gpu_check("--out", str(tmp_path / "report"))
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert report["gpu"] is False and report["failed_parts"] == []
    assert markdown.startswith("# GPU check\n\n**no GPU**: torch.cuda.is_available() is False")
    for part in ("tests", "benchmarks"):
        assert report["parts"][part]["status"] == "skipped"
        assert report["parts"][part]["reason"].startswith("no GPU: torch.cuda.is_available() is False")
        assert f"| {part} | skipped | 0 | no GPU:" in markdown
    assert report["parts"]["versions"]["status"] == "ok" and report["parts"]["device"]["status"] == "ok"
    assert report["versions"]["torch"] == torch.__version__
    assert "| transformers |" in markdown and "| bitsandbytes |" in markdown
    assert report["tests"]["cases"] == [] and report["benchmarks"]["gpu_throughput"] is None


@no_gpu_here
def test_a_part_that_fails_is_named_and_the_others_still_run(tmp_path):
    """An interpreter that fails every command: versions and device fail with their exit status,
    the GPU parts are skipped because the device is unknown, and the report (written by the
    python3 on PATH instead) says which parts failed."""
    if not shutil.which("python3"):
        pytest.skip("no python3 on PATH for the report")
    done = subprocess.run(["bash", str(SCRIPT), "--python", "false", "--out", str(tmp_path / "r")],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["failed_parts"] == ["versions", "device"]
    assert report["parts"]["versions"]["reason"].startswith("exit 1")
    assert "the device part failed" in report["parts"]["tests"]["reason"]
    assert "Failed parts: versions, device." in (tmp_path / "r" / "report.md").read_text()


def test_wheels_that_are_not_there_fail_that_part_only(tmp_path):
    (tmp_path / "wheels").mkdir()
    done = gpu_check("--out", str(tmp_path / "r"), "--wheels", str(tmp_path / "wheels"), "--parts", "versions")
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["parts"]["wheels"] == {"status": "failed", "reason": f"no .whl files in {tmp_path / 'wheels'}",
                                         "seconds": 0}
    assert report["parts"]["versions"]["status"] == "ok" and set(report["parts"]) == {"wheels", "versions"}


def test_a_report_that_cannot_be_written_is_a_non_zero_exit(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = gpu_check("--out", str(blocker / "report"), "--parts", "versions")
    assert done.returncode == 1
    assert "cannot write the report into" in done.stderr and "--out" in done.stderr


@pytest.mark.parametrize("args, said", [(["--parts", "tests,fsdp"], "unknown part 'fsdp'"),
                                        (["--frobnicate"], "unknown option --frobnicate")])
def test_wrong_options_are_refused_with_what_is_allowed(tmp_path, args, said):
    done = gpu_check("--out", str(tmp_path), *args)
    assert done.returncode == 2 and said in done.stderr


def test_the_report_lists_each_test_and_each_figure(tmp_path):
    """A GPU run's files, made here: JUnit XML from a real pytest run (one test passes, one fails,
    one is skipped) and the benchmark's JSON as it writes it."""
    cases = tmp_path / "test_cases.py"
    cases.write_text("import pytest\n"
                     "def test_holds():\n    assert 1\n"
                     "def test_breaks():\n    assert 0, 'KeyError: Parameter containing'\n"
                     "def test_not_here():\n    pytest.skip('needs bitsandbytes')\n")
    out = tmp_path / "out"
    (out / "parts").mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "pytest", str(cases), "-q", "-p", "no:cacheprovider",
                    f"--junitxml={out / 'tests.xml'}"], capture_output=True, cwd=tmp_path, timeout=120)
    (out / "parts" / "tests.json").write_text(json.dumps({"status": "failed", "reason": "exit 1: 1 failed",
                                                          "seconds": 3}))
    (out / "device.json").write_text(json.dumps({"cuda_available": True, "gpus": [
        {"name": "NVIDIA H200", "memory": "143771 MiB", "driver": "580.95.05", "compute_cap": "9.0"}]}))
    run = {"step_s": 0.05, "samples_per_s": 640.0, "tokens_per_s": 15000.0, "tflops_per_s": 9.9, "mfu": 0.01,
           "peak_allocated_mib": 3000, "final_loss": 0.69}
    (out / "gpu_throughput.json").write_text(json.dumps({
        "device": "NVIDIA H200", "peak_bf16_tflops": 989.0, "flops_formula": "6 x params x tokens", "fit_args": {},
        "parts": {"bert": {"model": "bert-base", "workbench": run, "eager": run, "workbench_over_eager": 1.0},
                  "lora": {"model": "SmolLM2-135M LoRA", "skipped": "SmolLM2's tokenizer is not available"}}}))
    assert gpu_check_report.main([str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    outcomes = {c["test"].split("::")[-1]: c["outcome"] for c in report["tests"]["cases"]}
    assert outcomes == {"test_holds": "passed", "test_breaks": "failed", "test_not_here": "skipped"}
    markdown = (out / "report.md").read_text()
    assert markdown.startswith("# GPU check\n\nGPU: NVIDIA H200 (143771 MiB, driver 580.95.05")
    assert "1 failed, 1 passed, 1 skipped." in markdown and "Failed parts: tests." in markdown
    assert "KeyError: Parameter containing" in markdown and "needs bitsandbytes" in markdown
    assert "| bert-base | workbench | 640.0 | 15000.0 | 50.0 | 9.9 | 1.0% | 3000 | 0.69 |" in markdown
    assert "| SmolLM2-135M LoRA | - | SmolLM2's tokenizer is not available |" in markdown
