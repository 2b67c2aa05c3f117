"""fit(task="causal_lm"): LoRA through the whole engine, its outputs, resume and refusals.

The model is the tiny random Llama with SmolLM2's real tokenizer and chat template
(tests/llm_fixtures.py): the engine's code paths at a fraction of the real model's cost.
Task-level behaviour (labels, adapters, merging) is in test_causal_lm.py and test_lora.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import workbench
from workbench.engine import checkpoint
from workbench.engine.train import fit
from workbench.errors import CheckpointError, ConfigError
from workbench.sources.synthetic_llm import make_chat_dataset, make_chat_rows

LORA = {"task": "causal_lm", "lora_r": 4, "lora_alpha": 8, "learning_rate": 3e-3, "batch_size": 8,
        "max_length": 160, "num_workers": 0, "log_every": 1}


def _events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


def _safetensors(folder: Path, name: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(folder / name)


@pytest.fixture(scope="module")
def lora_run(tiny_llama_dir, tmp_path_factory):
    """One LoRA run with an eval before and after training, the generation check and a merged model."""
    out = tmp_path_factory.mktemp("causal") / "run"
    result = fit(str(tiny_llama_dir), make_chat_dataset(64, 16), output_dir=str(out), max_steps=16,
                 eval_every=8, eval_generate=3, eval_max_new_tokens=6, merge_adapter=True, **LORA)
    return result, out


def test_lora_run_lowers_eval_loss_and_saves_adapter_best_and_merged_model(lora_run, tiny_llama_dir):
    result, out = lora_run
    assert result.status == "completed"
    evals = [e for e in _events(out) if e["kind"] == "eval"]
    assert [e["step"] for e in evals] == [8, 16]
    assert evals[-1]["eval_loss"] < evals[0]["eval_loss"]
    assert {"eval_loss", "eval_perplexity", "eval_exact_match"} <= set(result.metrics)
    assert result.metrics["eval_perplexity"] == pytest.approx(
        torch.tensor(result.metrics["eval_loss"]).exp().item(), rel=1e-6)
    # model/ is the adapter (a few MB), not a copy of the base model.
    model_files = {p.name for p in result.model_dir.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= model_files
    assert "model.safetensors" not in model_files
    assert (out / "best" / "adapter_model.safetensors").is_file()
    assert json.loads((out / "best" / "best.json").read_text())["step"] == 16  # lower loss is better
    start = next(e for e in _events(out) if e["kind"] == "start")
    assert start["config"]["task"] == "causal_lm" and start["config"]["finetune"] == "lora"
    # The checkpoint holds the adapter and its optimizer state only: far below the base model.
    ckpt = checkpoint.latest_checkpoint(out)
    ckpt_bytes = sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file())
    base_bytes = (tiny_llama_dir / "model.safetensors").stat().st_size
    assert ckpt_bytes < base_bytes / 5, (ckpt_bytes, base_bytes)
    record = checkpoint.read_record(ckpt)
    assert record["finetune"] == "lora" and record["lora"]["r"] == 4 and record["data_fingerprint"]


def test_merged_model_loads_in_a_pipeline_and_equals_base_plus_adapter(lora_run, tiny_llama_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, pipeline

    _, out = lora_run
    merged_dir = out / "model_merged"
    assert (merged_dir / "config.json").is_file()
    # Trained under bf16 autocast where the CPU has native bf16 (auto): adapter and merged model
    # are still saved in fp32, never silently bf16.
    for folder, name in ((out / "model", "adapter_model.safetensors"), (merged_dir, "model.safetensors")):
        assert {t.dtype for t in _safetensors(folder, name).values()} == {torch.float32}, folder
    ids = torch.tensor([[1, 450, 3200, 77, 12, 9000]])
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)(ids).logits
        base = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
        adapted = PeftModel.from_pretrained(base, out / "model")(ids).logits
    assert torch.allclose(merged, adapted, atol=1e-4)
    generator = pipeline("text-generation", model=str(merged_dir), device="cpu")
    text = generator([{"role": "user", "content": "What color is Anna's door?"}], max_new_tokens=4)
    assert text and text[0]["generated_text"]


def test_a_jsonl_file_trains_and_a_changed_lora_setting_is_refused_on_resume(tiny_llama_dir, tmp_path):
    data = tmp_path / "chats"
    data.mkdir()
    for split, n, seed in (("train", 24, 0), ("validation", 8, 1)):
        with open(data / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for row in make_chat_rows(n, seed):
                f.write(json.dumps(row) + "\n")
    out = tmp_path / "run"
    settings = {**LORA, "max_steps": 2, "output_dir": str(out)}
    assert fit(str(tiny_llama_dir), str(data), **settings).status == "completed"
    with pytest.raises(CheckpointError, match="lora"):
        fit(str(tiny_llama_dir), str(data), **{**settings, "max_steps": 4, "lora_r": 8})


def test_causal_lm_refusals_come_before_anything_is_written(tiny_llama_dir, tmp_path):
    out = tmp_path / "never"
    data = make_chat_dataset(8, 4)
    with pytest.raises(ConfigError, match="NVIDIA GPU") as err:
        fit(str(tiny_llama_dir), data, task="causal_lm", finetune="qlora", output_dir=str(out))
    assert "finetune='lora'" in err.value.fix
    with pytest.raises(ConfigError) as err:
        fit(str(tiny_llama_dir), data, task="causal_lm", text_columns=["text"], output_dir=str(out))
    assert err.value.field == "text_columns" and "messages_column" in err.value.fix
    with pytest.raises(ConfigError) as err:
        fit(str(tiny_llama_dir), data, task="causal_lm", best_metric="accuracy", output_dir=str(out))
    assert err.value.field == "best_metric"
    assert not out.exists()


def test_train_command_runs_a_causal_lm_config(tiny_llama_dir, tmp_path):
    import yaml

    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in make_chat_rows(30, 3)), encoding="utf-8")
    spec = {"model": {"name_or_path": str(tiny_llama_dir)},
            "data": {"source": "files", "path": str(data), "eval_split": None, "validation_fraction": 0.2},
            "train": {**LORA, "max_steps": 3, "output_dir": str(tmp_path / "run")}}
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(spec), encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "workbench", "train", "--config", str(config)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (tmp_path / "run" / "model" / "adapter_model.safetensors").is_file()
    assert workbench.result_from_disk(tmp_path / "run").status == "completed"


# ----------------------------------------------------------------------- kill -9
WORKER = r'''
import os, sys, time
import torch
torch.set_num_threads(1)
import workbench.engine.events as events
from workbench.sources.synthetic_llm import make_chat_dataset
from workbench.engine.train import fit

slow = float(os.environ.get("SLOW_STEP_S", "0"))
if slow:  # long enough to be killed part-way
    original = events.EventLog.write
    def write(self, kind, **fields):
        if kind == "train":
            time.sleep(slow)
        return original(self, kind, **fields)
    events.EventLog.write = write

result = fit(sys.argv[1], make_chat_dataset(48, 8, seed=5), output_dir=sys.argv[2], task="causal_lm",
             lora_r=4, lora_alpha=8, lora_dropout=0.1, learning_rate=3e-3, batch_size=4, max_length=160,
             max_steps=STEPS, save_every=3, log_every=1, keep_checkpoints=2, num_workers=0,
             warmup_ratio=0.1, precision="bf16",  # what auto picks on CPUs with bf16 instructions
             packing={"1": True, "0": False}.get(os.environ.get("PACKING"), "auto"))
print("STATUS", result.status)
'''
STEPS = 14


def _run(script, model, out, env=None, wait=True):
    proc = subprocess.Popen([sys.executable, str(script), str(model), str(out)],
                            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if wait:
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0 and "STATUS completed" in output, output[-3000:]
    return proc


def _losses(out: Path) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in _events(out) if e["kind"] == "train"}  # resumed value wins


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_lora_run_killed_mid_run_resumes_exactly(tiny_llama_dir, tmp_path, packed):
    """Adapter weights, their AdamW state, the schedule and the dropout RNG all come back:
    the resumed run's losses and final adapter equal an uninterrupted run's, padded or packed."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER.replace("STEPS", str(STEPS)))
    env = {"PACKING": "1" if packed else "0"}
    reference = tmp_path / "uninterrupted"
    _run(script, tiny_llama_dir, reference, env=env)
    if packed:
        assert "packed into one row" in (reference / "events.jsonl").read_text()

    out = tmp_path / "killed"
    proc = _run(script, tiny_llama_dir, out, env={"SLOW_STEP_S": "0.3", **env}, wait=False)
    deadline = time.time() + 240
    while not ((out / "events.jsonl").exists() and len(_losses(out)) >= 8):
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.time() < deadline, "the worker did not reach step 8"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    resumed_after = checkpoint.step_of(checkpoint.latest_checkpoint(out))
    assert 3 <= resumed_after < STEPS
    _run(script, tiny_llama_dir, out, env=env)

    ref, got = _losses(reference), _losses(out)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in range(resumed_after + 1, STEPS + 1):
        assert got[step] == pytest.approx(ref[step], abs=1e-6), step
    ref_w = _safetensors(reference / "model", "adapter_model.safetensors")
    got_w = _safetensors(out / "model", "adapter_model.safetensors")
    assert ref_w.keys() == got_w.keys() and ref_w
    for name in ref_w:
        assert torch.equal(got_w[name], ref_w[name]), name  # bit-exact
        assert got_w[name].dtype == torch.float32, name  # trained under bf16 autocast, saved fp32


def test_packed_run_ends_at_the_padded_runs_loss(tiny_llama_dir, tmp_path):
    """The same run with packing forced on and off, fp32: the same batches in another layout, so the
    per-step losses agree within float noise, and so do the final evaluation and the adapter."""
    runs = {}
    for packed in (False, True):
        out = tmp_path / ("packed" if packed else "padded")
        result = fit(str(tiny_llama_dir), make_chat_dataset(48, 8, seed=3), output_dir=str(out), max_steps=8,
                     lora_dropout=0.0, precision="fp32", packing=packed, **LORA)
        runs[packed] = (result, _losses(out))
    (padded, padded_losses), (packed, packed_losses) = runs[False], runs[True]
    assert sorted(packed_losses) == list(range(1, 9))
    for step, loss in padded_losses.items():
        assert packed_losses[step] == pytest.approx(loss, abs=1e-4), step
    assert packed.metrics["eval_loss"] == pytest.approx(padded.metrics["eval_loss"], abs=1e-4)
    assert padded_losses[8] < padded_losses[1]  # it trained: the agreement is not that of two idle runs
