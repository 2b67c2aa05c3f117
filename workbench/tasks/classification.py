"""Sequence classification with any ``AutoModelForSequenceClassification``.

Text (or sentence pairs) and a label column in; a model that
``pipeline("text-classification", model=...)`` loads out. Tokenization runs once,
unpadded; batches are padded to their own longest row; the metrics are loss,
accuracy and macro-F1.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from workbench.config import ModelChoice, TrainConfig
from workbench.sources import model_checks
from workbench.sources.data_checks import check_split, require_dataset_dict
from workbench.tasks import classification_data
from workbench.tasks.base import (
    FullWeights,
    enable_gradient_checkpointing,
    fingerprint,
    load_pretrained,
)
from workbench.tasks.metrics import classification_metrics, trivial_baselines


class ClassificationTask(FullWeights):
    name = "classification"

    def __init__(self, text_columns: Sequence[str], label_column: str):
        self.text_columns = tuple(text_columns)
        self.label_column = label_column
        self.labels: classification_data.LabelMapping | None = None
        self.notes: list[tuple[str, str]] = []  # (text, level) from loading, logged after "start"
        self._sample_texts: list[str] = []  # to check the tokenizer against the model
        self.train_label_counts: list[int] = []  # per class id, from check_data

    # -- data ---------------------------------------------------------------------
    def check_data(self, splits) -> None:
        require_dataset_dict(splits)
        for split, min_classes in (("train", 2), ("validation", 1)):  # a small eval split may hold one class
            check_split(splits.get(split), split, self.text_columns, self.label_column, min_classes=min_classes)
        self._sample_texts = model_checks.sample_texts(splits["train"], self.text_columns)
        self.labels = classification_data.build_label_mapping(splits["train"], splits["validation"], self.label_column)
        # How often each class is a training label: the majority-class baseline of the run's verdict.
        value_to_id, counts = self.labels.value_to_id(), [0] * len(self.labels.names)
        for value in splits["train"][self.label_column]:
            counts[value_to_id[value]] += 1
        self.train_label_counts = counts
        self.data_fingerprint = fingerprint(splits["train"], (*self.text_columns, self.label_column))

    def datasets(self, splits, tokenizer, max_length: int, model=None):
        token_types = getattr(getattr(model, "config", None), "type_vocab_size", 0) > 1
        return tuple(
            classification_data.tokenize(splits[s], tokenizer, self.text_columns, self.label_column, self.labels,
                              max_length, token_types=token_types)
            for s in ("train", "validation")
        )

    def collator(self, tokenizer):
        from transformers import DataCollatorWithPadding

        # Pads each batch to its own longest row (never to max_length) with the mask to match.
        return DataCollatorWithPadding(tokenizer, return_tensors="pt")

    def rows(self, batch: dict) -> int:
        return len(batch["labels"])

    units = rows  # the loss is a mean over rows

    # -- model --------------------------------------------------------------------
    def load_tokenizer(self, choice: ModelChoice):
        from transformers import AutoTokenizer

        tokenizer = load_pretrained(AutoTokenizer, choice)
        if tokenizer.pad_token is None:  # GPT-style tokenizers: padding is masked out anyway
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer

    def build_model(self, choice: ModelChoice, tokenizer, config: TrainConfig | None = None):
        from transformers import AutoModelForSequenceClassification

        # transformers' red "LOAD REPORT ... MISSING classifier.weight" is expected here: one
        # calm line instead, and the report kept for real mismatches.
        with model_checks.new_head_notice(len(self.labels.names), announce=None) as notice:
            model = load_pretrained(
                AutoModelForSequenceClassification, choice,
                num_labels=len(self.labels.names), id2label=self.labels.id2label,
                label2id=self.labels.label2id,
                ignore_mismatched_sizes=True,  # a new head when the label count differs
                # fp32 master weights whatever the checkpoint stores: autocast gives the speed,
                # and AdamW on bf16/fp16 weights loses small updates.
                dtype=torch.float32,
            )
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        if getattr(config, "gradient_checkpointing", False):
            enable_gradient_checkpointing(model)
        self.notes = [(notice.message, "info")] if notice.message else []
        # An empty or foreign tokenizer trains on [UNK]s to chance accuracy: refuse or warn.
        self.notes += [(w, "warn") for w in model_checks.check_tokenizer(tokenizer, model.config,
                                                                          self._sample_texts)]
        return model

    # -- training and evaluation --------------------------------------------------
    def loss(self, model, batch: dict) -> torch.Tensor:
        return model(**batch).loss

    def eval_outputs(self, model, batch: dict) -> tuple[torch.Tensor, ...]:
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        logits = model(**inputs).logits.float()
        row_loss = F.cross_entropy(logits, batch["labels"], reduction="none")
        return row_loss, logits.argmax(-1), batch["labels"]

    def metrics(self, outputs: list[tuple[torch.Tensor, ...]]) -> dict[str, float]:
        loss, predictions, labels = (torch.cat(parts) for parts in zip(*outputs, strict=True))
        return classification_metrics(predictions, labels, len(self.labels.names), loss.mean().item())

    def baselines(self, outputs: list[tuple[torch.Tensor, ...]]) -> dict:
        """Chance and the training labels' majority class, scored on these eval rows (the verdict's bar)."""
        labels = torch.cat([parts[2] for parts in outputs])
        return trivial_baselines(labels, self.train_label_counts, self.labels.names)

    # -- saving ---------------------------------------------------------------------
    def save_model(self, model, tokenizer, directory: Path, state_dict: dict | None = None) -> None:
        model.save_pretrained(directory, state_dict=state_dict)
        tokenizer.save_pretrained(directory)
        mapping = {"id2label": self.labels.id2label, "label2id": self.labels.label2id,
                   "values": [str(v) for v in self.labels.values]}
        (directory / classification_data.LABELS_FILE).write_text(json.dumps(mapping, indent=2) + "\n", encoding="utf-8")

    def finish(self, model_dir: Path, write_dir) -> list[tuple[str, str]]:
        return []

    def check_model(self, choice: ModelChoice) -> None:
        """Nothing depends on the model's layers here: the head is made for the labels."""

    def num_classes(self) -> int | None:
        return len(self.labels.names) if self.labels else None

    def identity(self) -> dict:
        return {"task": self.name, "text_columns": list(self.text_columns), "label_column": self.label_column,
                "labels": list(self.labels.names), "data_fingerprint": self.data_fingerprint}
