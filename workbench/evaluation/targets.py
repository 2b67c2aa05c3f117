"""What to evaluate: a run folder, a model folder, an adapter, a hub id, or a model already loaded.

Every form becomes a ``Target``: the arguments lm-evaluation-harness loads it with (the same
``pretrained=`` / ``peft=`` model arguments as its own command line, so an evaluation through the
workbench runs what ``lm_eval --model hf`` runs), or the model object itself, plus where its
results belong (the run folder and the model folder of the run, for the results files, the
runs table and the model card).

A run folder gives its final model: ``model_merged/`` when it is at least as new as the adapter
(a plain model: no LoRA layers to run), else the adapter on its base; ``checkpoint="best"`` its
``best/`` folder. A hub id that is not in the local cache while the hub is switched off is refused
here, before anything loads.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.errors import EvaluationError
from workbench.shipping.card import read_record
from workbench.shipping.gguf_export import merged_is_current
from workbench.sources.hub import OFFLINE_FIX, is_offline
from workbench.sources.paths import looks_like_local_path

MERGED_DIR = "model_merged"  # = workbench.tasks.causal_lm.MERGED_DIR (that module imports torch)
CHECKPOINTS = ("final", "best")


@dataclass
class Target:
    """One model to evaluate and where its results go."""

    label: str  # its name in tables: the run folder's name, the folder's, the hub id, "model"
    kind: str  # run | folder | adapter | hub | object
    pretrained: str | None = None  # what the harness loads (a folder or hub id)...
    peft: str | None = None  # ...with this adapter on it
    model: Any = None  # or the model object itself, with its tokenizer
    tokenizer: Any = None
    run_dir: Path | None = None  # the run whose results folder gets the results (None: not saved)
    folder_name: str | None = None  # model | model_merged | best: which of the run's models
    task: str = "causal_lm"  # the run's task: causal_lm | classification

    @property
    def model_folder(self) -> Path | None:
        return self.run_dir / self.folder_name if self.run_dir and self.folder_name else None

    def describe(self) -> str:
        """What is evaluated: the folder or hub id (and adapter), or "a model object"."""
        if self.kind == "object":
            return "a model object"
        return str(self.pretrained) + (f" + adapter {self.peft}" if self.peft else "")


def _is_run(path: Path) -> bool:
    return (path / "events.jsonl").is_file() or (path / "run.json").is_file()


def _adapter_base(folder: Path) -> str:
    try:
        config = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EvaluationError(f"{folder / 'adapter_config.json'} cannot be read ({exc}).",
                              "the adapter folder is damaged: save the adapter again.") from None
    return str(config.get("base_model_name_or_path") or "")


def _loadable(name: str) -> str:
    """A base model the harness can load: a .gguf file is converted once to a folder (as for training)."""
    if name.lower().endswith(".gguf") and Path(name).expanduser().is_file():
        from workbench.sources.gguf import convert_gguf

        return str(convert_gguf(name))
    return name


def from_run(run_dir: Path, checkpoint: str = "final", label: str | None = None) -> Target:
    if checkpoint not in CHECKPOINTS:
        raise EvaluationError(f"checkpoint={checkpoint!r} is not one of {', '.join(CHECKPOINTS)}.",
                              "use 'final' (the run's final model) or 'best' (its best/ folder).")
    record = read_record(run_dir)
    task = record.get("task") or (record.get("config") or {}).get("task") or "causal_lm"
    name = "model" if checkpoint == "final" else "best"
    folder = run_dir / name
    if not folder.is_dir():
        fix = ("wait for the run to finish, or evaluate checkpoint='best'" if name == "model"
               else "the run saved no best model yet (it is written at the first evaluation)")
        raise EvaluationError(f"The run in {run_dir} has no {name}/ folder to evaluate.", fix + ".")
    label = label or run_dir.name
    if (folder / "adapter_config.json").is_file():
        merged = run_dir / MERGED_DIR
        if name == "model" and merged_is_current(folder, merged):
            return Target(label, "run", pretrained=str(merged), run_dir=run_dir, folder_name=MERGED_DIR, task=task)
        base = record.get("model") or _adapter_base(folder)
        return Target(label, "run", pretrained=_loadable(str(base)), peft=str(folder), run_dir=run_dir,
                      folder_name=name, task=task)
    return Target(label, "run", pretrained=str(folder), run_dir=run_dir, folder_name=name, task=task)


def resolve(model: Any, *, checkpoint: str = "final", tokenizer=None, label: str | None = None) -> Target:
    """The Target for one of the accepted forms (see the module doc)."""
    if isinstance(model, tuple) and len(model) == 2:
        model, tokenizer = model
    if not isinstance(model, (str, os.PathLike)):
        if tokenizer is None:
            raise EvaluationError("A model object needs its tokenizer to be evaluated.",
                                  "pass evaluate((model, tokenizer), ...) or evaluate(model, tokenizer=tokenizer).")
        return Target(label or "model", "object", model=model, tokenizer=tokenizer)
    path = Path(model).expanduser()
    if path.exists():
        if _is_run(path):
            return from_run(path, checkpoint, label)
        parent = path.parent if _is_run(path.parent) and path.name in ("model", "best", MERGED_DIR) else None
        task = (read_record(parent).get("task") if parent else None) or "causal_lm"
        if (path / "adapter_config.json").is_file():
            return Target(label or path.name, "adapter", pretrained=_loadable(_adapter_base(path)), peft=str(path),
                          run_dir=parent, folder_name=path.name if parent else None, task=task)
        if (path / "config.json").is_file():
            return Target(label or (f"{parent.name}/{path.name}" if parent else path.name), "folder",
                          pretrained=str(path), run_dir=parent, folder_name=path.name if parent else None, task=task)
        raise EvaluationError(f"{path} is neither a run folder (events.jsonl) nor a model folder (config.json).",
                              "pass a run's output_dir, a saved model folder, or a hub id.")
    text = str(model)
    if looks_like_local_path(text):
        raise EvaluationError(f"{text} does not exist.", "check the path: a run's output_dir or a model folder.")
    check_hub_model(text)
    return Target(label or text, "hub", pretrained=text)


def check_hub_model(name: str) -> None:
    """EvaluationError when the hub is switched off and ``name`` is not in the local cache."""
    if not is_offline():
        return
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(name, "config.json")
    if not isinstance(cached, str):
        raise EvaluationError(f"The model {name!r} is not in the local Hugging Face cache and the hub is "
                              "switched off (HF_HUB_OFFLINE=1).", OFFLINE_FIX + ".")


def resolve_all(models: Any, *, checkpoint: str = "final", tokenizer=None) -> list[Target]:
    """A dict {label: model} keeps its labels; anything else is one model."""
    if isinstance(models, dict):
        targets = [resolve(m, checkpoint=checkpoint, label=str(k)) for k, m in models.items()]
    else:
        targets = [resolve(models, checkpoint=checkpoint, tokenizer=tokenizer)]
    labels = [t.label for t in targets]
    if len(set(labels)) != len(labels):
        raise EvaluationError(f"Two models would have the same name in the table: {labels}.",
                              "pass a dict {name: model} with distinct names.")
    return targets
