"""The seam between the engine and a task: the ``Task`` protocol, and what every task shares.

``Task`` lists what the engine's loop asks of a task; ``split_batch``, ``fingerprint``,
``load_pretrained``, ``load_full_state`` and ``enable_gradient_checkpointing`` are the
helpers the tasks have in common. The encoder tasks (classification, token classification,
question answering) also share ``FullWeights`` (every weight trains and is checkpointed),
``RowsDataset`` and ``PadToLongest`` (token lists padded per batch), and
``write_predictions`` / ``read_predictions`` (the evaluation's answers saved beside a model).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from workbench.config import ModelChoice, TrainConfig
from workbench.errors import ModelError

# Beside a saved model (model/, best/): the answers of the evaluation those weights had, one
# JSON object per line, so an error analysis reads the run folder instead of predicting again.
PREDICTIONS_FILE = "eval_predictions.jsonl"


class Task(Protocol):
    name: str  # "classification", ...: recorded with the run, checked on resume
    notes: list[tuple[str, str]]  # (text, level) from loading the model: logged after "start"

    def check_data(self, splits) -> None:
        """Everything that can be wrong with the data, found before any training (DataError)."""

    def check_model(self, choice: ModelChoice) -> None:
        """Settings that depend on the model's layers, checked before anything loads (ConfigError)."""

    def load_tokenizer(self, choice: ModelChoice) -> Any: ...

    def build_model(self, choice: ModelChoice, tokenizer, config: TrainConfig) -> torch.nn.Module:
        """The model ready to train, on the CPU, fp32 master weights. ``config.precision`` is the
        precision that runs (fp32 | fp16 | bf16, never "auto"): frozen weights may be loaded in it."""

    def datasets(self, splits, tokenizer, max_length: int, model) -> tuple[Any, Any]:
        """(train, eval) torch Datasets; each has ``.lengths`` (tokens per row) for the sampler."""

    def collator(self, tokenizer) -> Any:
        """collate_fn: rows -> a dict of padded tensors."""

    def rows(self, batch: dict) -> int:
        """Examples in a batch (to split it into micro-batches)."""

    def units(self, batch: dict) -> torch.Tensor | int:
        """What ``loss`` averages over (rows; supervised tokens for a language model):
        micro-batches of one optimizer step are weighted by their share of it."""

    def loss(self, model, batch: dict) -> torch.Tensor:
        """Mean training loss of the batch (a scalar tensor, no host sync)."""

    def eval_outputs(self, model, batch: dict) -> tuple[torch.Tensor, ...]:
        """Per-row tensors the metrics need; gathered across processes."""

    def metrics(self, outputs: list[tuple[torch.Tensor, ...]]) -> dict[str, float]:
        """``eval_loss`` and the task's metrics from every batch's eval outputs."""

    def generation_metrics(self, model, tokenizer) -> dict[str, float]:
        """Metrics that need generation (a language model's exact match); {} when off or none."""

    # Optional: ``baselines(outputs) -> {"rows": n, "baselines": [{"name", "detail", "metrics"}]}``,
    # what models that learned nothing score on these eval outputs (a classifier: chance and the
    # majority class). The run's verdict (engine/verdict.py) is judged against them; a task
    # without it (a language model) is judged against the base model's evaluation.
    #
    # Optional: ``take_train_tally() -> (names, sums) | None``, the task's own train-side metrics
    # since the last call: ``sums`` a 1-D device tensor ``[rows, sum of each name...]`` that
    # ``loss`` added to (no host sync). The engine sums it over processes at each train log and
    # writes ``sum / rows`` under each name beside the loss (a preference run: reward accuracy).
    #
    # Optional: ``before_training(accelerator, model, train_dataset, collate, *, batch_size,
    # rows_trained, run_dir, record, halving) -> messages``, called once the model is prepared (and a
    # checkpoint loaded), before the start loss is measured: work done once per run rather than
    # per step (a preference run: the reference's log-probabilities, preference_reference.py).

    def model_state(self, model) -> dict[str, torch.Tensor]:
        """The weights a checkpoint must hold (an adapter's only, for LoRA)."""

    def load_model_state(self, model, state: dict[str, torch.Tensor]) -> None: ...

    def save_model(self, model, tokenizer, directory: Path, state_dict: dict | None) -> None:
        """Write the final (or best) model so its pipeline loads ``directory``."""

    def finish(self, model_dir: Path, write_dir: Callable[[Path, Callable[[Path], None]], Path]
               ) -> list[tuple[str, str]]:
        """Outputs made from the saved final model (a merged LoRA model); (text, level) messages.
        Called on the main process only. ``write_dir(final, write)`` is the engine's atomic
        folder writer: ``write(tmp)`` fills a temporary folder that then replaces ``final``."""

    def num_classes(self) -> int | None:
        """What the model chooses among at each prediction (labels; vocabulary tokens for an LM):
        ln of it is the loss of a uniform guess, where a diverged run ends up. None: unknown."""

    def identity(self) -> dict[str, Any]:
        """Facts that make a run this run (labels, ...): written to the run record."""


def fingerprint(dataset, columns) -> str:
    """A hash of ``columns`` of every row: the same data gives the same value in any process."""
    digest = hashlib.sha256()
    for start in range(0, len(dataset), 10_000):
        rows = dataset.select_columns(list(columns))[start:start + 10_000]
        digest.update(json.dumps(rows, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def enable_gradient_checkpointing(model) -> None:
    """Recompute activations in the backward pass: less memory, ~30% more compute.

    Non-reentrant checkpointing works with DDP and with frozen inputs (LoRA).
    transformers 5 renamed the method; the old name warns.
    """
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def split_batch(task: Task, batch: dict, size: int) -> list[dict]:
    """``batch`` cut into micro-batches of at most ``size`` rows (after an out-of-memory)."""
    rows = task.rows(batch)
    if rows <= size:
        return [batch]
    if hasattr(task, "split"):  # batches that are not one row per example (flattened sequences)
        return task.split(batch, size)
    return [{k: v[i:i + size] for k, v in batch.items()} for i in range(0, rows, size)]


def load_pretrained(auto_class, choice: ModelChoice, **kwargs):
    """``auto_class.from_pretrained`` with every failure turned into a ModelError with a fix.

    A ``.gguf`` file (llama.cpp, Ollama) is converted to a model folder once, then cached.
    """
    from workbench.sources.hub import OFFLINE_FIX, is_offline

    source = str(choice.name_or_path)
    if source.lower().endswith(".gguf"):
        from workbench.sources.gguf import convert_gguf

        source = str(convert_gguf(source))
    try:
        return auto_class.from_pretrained(source, revision=choice.revision, **kwargs)
    except Exception as exc:  # OSError, ValueError, HF hub errors: all mean "cannot load this"
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        fix = "check the name on https://huggingface.co/models, or pass a local folder with config.json"
        if is_offline():
            fix = OFFLINE_FIX
        raise ModelError(f"Cannot load model {choice.name_or_path!r}: {reason}", fix) from None


def load_full_state(model, state: dict[str, torch.Tensor], fix: str) -> None:
    """Every weight of ``model`` from ``state``; ModelError (with ``fix``) when they do not fit."""
    # strict=False: safetensors drops tied duplicates; anything else missing is an error.
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "all_tied_weights_keys", {}) or {})
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise ModelError(f"The checkpoint's weights do not fit this model (missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}).", fix)


def write_predictions(directory: str | Path, rows: list[dict]) -> None:
    """``rows`` as ``PREDICTIONS_FILE`` in ``directory`` (nothing when there are none yet)."""
    if rows:
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        (Path(directory) / PREDICTIONS_FILE).write_text(text, encoding="utf-8")


def read_predictions(model_dir: str | Path) -> list[dict]:
    """The evaluation's answers saved beside a model; [] when the folder has none."""
    path = Path(model_dir) / PREDICTIONS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class FullWeights:
    """What a task that fine-tunes every weight of a model shares: the checkpoint holds all of
    them, nothing is generated at evaluation, no setting depends on the model's layers."""

    def model_state(self, model) -> dict[str, torch.Tensor]:
        return model.state_dict()

    def load_model_state(self, model, state: dict[str, torch.Tensor]) -> None:
        load_full_state(model, state, "resume with the model the run was started with, or start over "
                                      "with resume=None.")

    def generation_metrics(self, model, tokenizer) -> dict[str, float]:
        return {}

    def check_model(self, choice: ModelChoice) -> None:
        """Nothing depends on the model's layers: the head is made for the task."""


class RowsDataset(torch.utils.data.Dataset):
    """Tokenized rows held as Python lists by column (cheap to batch), each row also carrying its
    own index under ``index_name`` so that eval outputs can be matched back to it."""

    def __init__(self, columns: dict[str, list], index_name: str):
        self.columns = columns
        self.index_name = index_name
        self.lengths = [len(ids) for ids in columns["input_ids"]]  # tokens per row, for the sampler

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict:
        return {**{name: values[index] for name, values in self.columns.items()}, self.index_name: index}


class PadToLongest:
    """Rows -> a batch of tensors: the lists in ``pad`` padded to the batch's longest row with their
    pad value, an attention mask to match, and every other field (one number per row) stacked."""

    def __init__(self, pad: dict[str, int]):
        self.pad = pad

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        longest = max(len(r["input_ids"]) for r in rows)
        batch = {name: torch.tensor([r[name] + [value] * (longest - len(r[name])) for r in rows])
                 for name, value in self.pad.items() if name in rows[0]}
        batch["attention_mask"] = torch.tensor([[1] * len(r["input_ids"]) + [0] * (longest - len(r["input_ids"]))
                                                for r in rows])
        batch.update({name: torch.tensor([r[name] for r in rows]) for name in rows[0] if name not in self.pad})
        return batch
