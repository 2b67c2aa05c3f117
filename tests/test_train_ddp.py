"""Two real DDP processes (gloo on CPU) through `torchrun ... workbench train --config`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from workbench.config import DatasetChoice, ModelChoice, RunSpec, TrainConfig
from workbench.sources.synthetic import write_csv

# `workbench train` as torchrun starts it, plus a hash of each rank's final weights
# (taken where the engine saves the final model, which every rank reaches).
HASHING_LAUNCHER = r'''
import hashlib, os, sys
import torch
from pathlib import Path
import workbench.engine.train as engine
from workbench.cli import main

hashes, original = Path(os.environ["HASH_DIR"]), engine._save_model

def save_model_and_hash(run, directory, extra=None):
    if directory.name == "model":
        digest = hashlib.sha256()
        for name, tensor in sorted(run.accelerator.unwrap_model(run.model).state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())  # bf16 too
        hashes.mkdir(parents=True, exist_ok=True)
        (hashes / f"rank{run.accelerator.process_index}.sha256").write_text(digest.hexdigest())
    return original(run, directory, extra)

engine._save_model = save_model_and_hash
sys.exit(main(sys.argv[1:]))
'''


def _torchrun_llm(tiny_llama_dir, tmp_path, rows, counts, launcher_text=HASHING_LAUNCHER, env=None, timeout=300,
                  **train):
    """``workbench train --config`` on 2 torchrun processes over ``rows(n, seed)`` written as the
    train and validation files (``counts``); returns (the finished process, the run folder, the hashes' folder)."""
    data = tmp_path / "data"
    data.mkdir()
    for split, n, seed in (("train", counts[0], 0), ("validation", counts[1], 1)):
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(n, seed)))
    out = tmp_path / "run"
    spec = RunSpec(model=ModelChoice(str(tiny_llama_dir)), data=DatasetChoice(source="files", path=str(data)),
                   train=TrainConfig(output_dir=str(out), learning_rate=3e-3, batch_size=4, log_every=1,
                                     num_workers=0, lora_r=4, lora_alpha=8, max_length=160, **train))
    config = spec.save(tmp_path / "run.yaml")
    hashes = tmp_path / "hashes"
    launcher = tmp_path / "launcher.py"
    launcher.write_text(launcher_text)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(launcher), "train", "--config", str(config), "--progress", "none"],
        env={**os.environ, "OMP_NUM_THREADS": "1", "HASH_DIR": str(hashes), **(env or {})},
        capture_output=True, text=True, timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (hashes / "rank0.sha256").read_text() == (hashes / "rank1.sha256").read_text()
    return proc, out, hashes


def test_two_processes_stay_identical_and_only_rank0_writes(tiny_bert, tmp_path):
    data = tmp_path / "data"
    write_csv(data / "train.csv", 96, seed=0)
    write_csv(data / "validation.csv", 32, seed=1)
    out = tmp_path / "run"
    spec = RunSpec(
        model=ModelChoice(str(tiny_bert)),
        data=DatasetChoice(source="files", path=str(data), text_columns=("text",), label_column="label"),
        train=TrainConfig(output_dir=str(out), learning_rate=2e-3, batch_size=8, max_steps=6, save_every=3,
                          log_every=1, num_workers=0, gradient_accumulation_steps=2),
    )
    config = spec.save(tmp_path / "run.yaml")
    hashes = tmp_path / "hashes"  # outside output_dir, one file per rank
    launcher = tmp_path / "launcher.py"
    launcher.write_text(HASHING_LAUNCHER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HASH_DIR": str(hashes)}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(launcher), "train", "--config", str(config), "--progress", "none"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    rank0, rank1 = (hashes / "rank0.sha256").read_text(), (hashes / "rank1.sha256").read_text()
    assert rank0 == rank1  # DDP kept the weights identical on both ranks

    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    kinds = Counter(e["kind"] for e in events)
    assert kinds["start"] == 1 and kinds["end"] == 1  # one writer, not two
    assert [e["step"] for e in events if e["kind"] == "train"] == [1, 2, 3, 4, 5, 6]
    start = next(e for e in events if e["kind"] == "start")
    assert start["world_size"] == 2
    # 96 rows / (8 per batch * 2 ranks) = 6 batches per rank and epoch, 2 per step.
    assert start["total_steps"] == 6 and events[-1]["status"] == "completed"
    checkpoints = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert checkpoints == ["step-000003", "step-000006"]
    assert (out / "model" / "config.json").is_file()
    assert not any("rank" in p.name for p in out.rglob("*"))


def test_fit_distributed_from_a_notebook_process(tiny_bert, tmp_path):
    """accelerate.notebook_launcher forks two gloo workers; the result comes back from disk."""
    from workbench.frontend import fit_distributed
    from workbench.sources.synthetic import make_dataset

    result = fit_distributed(str(tiny_bert), make_dataset(64, 16, seed=3), num_processes=2,
                             output_dir=str(tmp_path / "run"), learning_rate=2e-3, batch_size=8, max_steps=3,
                             log_every=1, num_workers=0, progress="none")
    assert result.status == "completed"
    assert result.label_names == ["negative", "positive"]
    assert set(result.metrics) == {"eval_loss", "eval_accuracy", "eval_f1"}
    start = next(e for e in result.history if e["kind"] == "start")
    assert start["world_size"] == 2
    assert sum(e["kind"] == "start" for e in result.history) == 1


def test_fit_distributed_refuses_once_cuda_is_initialised(monkeypatch, tmp_path):
    import torch

    from workbench.errors import WorkbenchError
    from workbench.frontend import fit_distributed

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(WorkbenchError, match="restart the kernel"):
        fit_distributed("any-model", None, num_processes=2, output_dir=str(tmp_path / "run"))


def test_two_processes_train_the_same_lora_adapter(tiny_llama_dir, tmp_path):
    """task: causal_lm under torchrun: rows split by rank, supervised-token-weighted
    accumulation, the adapters all-reduced (frozen base weights take no part)."""
    from workbench.sources.synthetic_llm import make_chat_rows

    _, out, _ = _torchrun_llm(tiny_llama_dir, tmp_path, make_chat_rows, (64, 16), task="causal_lm", max_steps=4,
                              gradient_accumulation_steps=2)
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    start = next(e for e in events if e["kind"] == "start")
    assert start["world_size"] == 2 and start["config"]["task"] == "causal_lm"
    assert [e["step"] for e in events if e["kind"] == "train"] == [1, 2, 3, 4]
    assert events[-1]["status"] == "completed" and "eval_loss" in events[-1]["metrics"]
    assert (out / "model" / "adapter_model.safetensors").is_file()


def test_two_processes_tune_the_same_preference_adapter_from_a_config_file(tiny_llama_dir, tmp_path):
    """task: preference under torchrun, from `--config`: each process precomputes the reference of
    its share of the pairs and the sum over processes gives both the whole table; pairs split by
    rank; the adapters all-reduced."""
    import torch

    from workbench.sources.synthetic_llm import make_preference_rows

    _, out, _ = _torchrun_llm(tiny_llama_dir, tmp_path, make_preference_rows, (32, 16), task="preference",
                              max_steps=4, beta=0.2, precision="fp32", precompute_reference=True)
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    start = next(e for e in events if e["kind"] == "start")
    assert start["world_size"] == 2 and start["config"]["task"] == "preference" and start["config"]["beta"] == 0.2
    trains = [e for e in events if e["kind"] == "train"]
    assert [e["step"] for e in trains] == [1, 2, 3, 4] and all("reward_accuracy" in e for e in trains)
    assert events[-1]["status"] == "completed" and "eval_reward_accuracy" in events[-1]["metrics"]
    # 4 steps x 4 pairs x 2 processes: every train pair seen, so all 32 + 16 are in the table.
    table = torch.load(out / "reference_logps.pt", weights_only=True)["values"]
    assert table.shape == (48, 4) and bool((table[:, :2] < 0).all()) and bool((table[:, 2:] >= 1).all())
    assert (out / "model" / "adapter_model.safetensors").is_file()
    record = json.loads((out / "run.json").read_text())
    assert record["preference"]["beta"] == 0.2


@pytest.mark.slow
def test_two_processes_with_compiled_blocks_and_fused_adapters_stay_identical(tiny_llama_dir, tmp_path):
    """compile=True under torchrun, as compile="auto" is on every CUDA rank: the LoRA blocks compiled
    with the sibling-adapter fusion (lora_dropout 0), DDP's all-reduce of their gradients (the fused
    B's arrive as blocks of one matrix), and both ranks end with the same weights, compiled, not eager."""
    from workbench.sources.synthetic_llm import make_chat_rows

    # Each rank also writes how many products the fusion pass removed when it compiled the blocks.
    launcher = HASHING_LAUNCHER.replace("sys.exit(main(sys.argv[1:]))", """
from workbench.engine.fuse_adapters import FUSE_SIBLING_ADAPTERS
status = main(sys.argv[1:])
(hashes / f"rank{os.environ['RANK']}.fused").write_text(str(FUSE_SIBLING_ADAPTERS.fused))
sys.exit(status)""")
    # Inductor's caches off: a graph from the cache would skip the pass, and its count with it.
    _, out, hashes = _torchrun_llm(
        tiny_llama_dir, tmp_path, make_chat_rows, (32, 8), launcher_text=launcher, timeout=600,
        env={"TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "TORCHINDUCTOR_AUTOGRAD_CACHE": "0"},
        task="causal_lm", max_steps=3, lora_dropout=0.0, compile=True, precision="fp32")
    assert all(int((hashes / f"rank{rank}.fused").read_text()) > 0 for rank in (0, 1))
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    start = next(e for e in events if e["kind"] == "start")
    assert start["world_size"] == 2 and start["compile"]["on"] and start["compile"]["block"] == "LlamaDecoderLayer"
    messages = [e["text"] for e in events if e["kind"] == "message"]
    assert any(text.startswith("Compiled ") for text in messages), messages  # the first step's compile note
    assert not any("failed" in text or "recompile" in text for text in messages), messages  # no fallback to eager
    assert events[-1]["status"] == "completed" and [e["step"] for e in events if e["kind"] == "train"] == [1, 2, 3]
