"""Shared fixtures. Tests never reach a hub: everything is built from local files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Set before transformers/datasets are imported by any test module.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

REPO = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    """GPU tests (tests/gpu/, marker `gpu`) run only where CUDA is usable."""
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:  # torch missing or broken: no GPU tests either
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with a working driver")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    """A small random BERT with a WordPiece tokenizer, saved like a hub download."""
    from workbench.sources.synthetic import make_tiny_bert

    return make_tiny_bert(tmp_path_factory.mktemp("models") / "tiny-bert")


@pytest.fixture(scope="session")
def trained_tiny_bert(tiny_bert, tmp_path_factory) -> Path:
    """The tiny BERT fine-tuned on the generated sentiment task (accuracy 1.0 after 120 steps, ~2 s):
    a model that already knows the task, for continued fine-tuning and for short runs that must
    beat chance (a fresh tiny BERT sits at ln 2 for its first ~55 steps)."""
    from workbench.engine.train import fit
    from workbench.sources.synthetic import make_dataset

    out = tmp_path_factory.mktemp("trained-bert") / "run"
    result = fit(str(tiny_bert), make_dataset(320, 64, seed=5), output_dir=str(out), learning_rate=2e-3,
                 batch_size=8, max_length=64, max_steps=120, warmup_ratio=0.1, num_workers=0, precision="fp32")
    assert result.metrics["eval_accuracy"] >= 0.95, result.metrics
    return result.model_dir


@pytest.fixture(scope="session")
def sentiment_data():
    """A generated, learnable sentiment task (DatasetDict: train 800 / validation 200)."""
    from workbench.sources.synthetic import make_dataset

    return make_dataset()


# Causal-LM fixtures (smollm2_dir, tiny_llama_dir) live in their own module.
from llm_fixtures import smollm2_dir, tiny_llama_dir, tiny_lora_run, trained_tiny_llama  # noqa: E402, F401
from span_fixtures import minilm, ner_folder, qa_folder, tiny_span_bert  # noqa: E402, F401


@pytest.fixture(scope="session", autouse=True)
def _course_results_stay_in_a_temp_folder(tmp_path_factory):
    """Check cells keep every result in a local file (workbench/classroom/client.py): the
    tests' results go to a throw-away folder, not to ~/.local/share."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WORKBENCH_COURSE_DIR", str(tmp_path_factory.mktemp("course-results")))
        yield
