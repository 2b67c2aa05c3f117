"""``{tiny_model}``, ``{tiny_data}`` and ``{output_dir}`` in profile parameters.

The ci profile cannot download weights or data, so the harness builds a tiny
model and dataset once per output folder and substitutes their paths.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Values the harness prepares and substitutes into string parameters ("{tiny_model}").
PLACEHOLDERS = ("tiny_model", "tiny_data", "output_dir")
# Enough rows for the tiny model to learn the generated task in a few epochs on CPU.
TINY_DATA_ROWS = {"train": 800, "validation": 200}


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

        from workbench.synthetic import make_tiny_bert

        hf_logging.disable_progress_bar()  # a bar per saved shard is noise in a CI log
        values["tiny_model"] = str(make_tiny_bert(shared_dir / "tiny-bert"))
    if "tiny_data" in needed:
        from workbench.synthetic import write_csv

        folder = shared_dir / "tiny-data"
        for seed, (split, rows) in enumerate(TINY_DATA_ROWS.items()):
            if not (folder / f"{split}.csv").is_file():
                write_csv(folder / f"{split}.csv", rows, seed=seed)
        values["tiny_data"] = str(folder)
    return values


def placeholders_in(value: Any) -> set[str]:
    """The placeholder names used anywhere in ``value`` (so only those get built)."""
    text = json.dumps(value)
    return {name for name in PLACEHOLDERS if "{" + name + "}" in text}
