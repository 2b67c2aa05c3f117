"""Token classification (named entities) with any ``AutoModelForTokenClassification``.

Words and a tag per word in (a dataset's tokens and ner_tags columns, or CoNLL files); a
model that ``pipeline("token-classification", model=..., aggregation_strategy="simple")``
loads out. The rows, their checks, the tag scheme and the sub-word alignment live in
``token_classification_data.py``; this module is the task object around them.

**Metrics.** Entity-level precision, recall and F1 with seqeval (an entity counts when its
type and both ends are right; per type too: ``eval_PER_f1``), and word accuracy; the best
model is the one with the best entity F1 (``best_metric`` "f1"). They are computed per
word from the first sub-word's prediction, whatever ``subword_labels`` trains on.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from workbench.config import ModelChoice, TrainConfig
from workbench.errors import DataError, ModelError
from workbench.sources import model_checks
from workbench.sources.data_checks import (
    SPLITS,
    find_token_columns,
    require_dataset_dict,
    split_with_rows,
)
from workbench.sources.data_files import ROW_COLUMN, RowLocator
from workbench.tasks import token_classification_data as data
from workbench.tasks.base import (
    FullWeights,
    enable_gradient_checkpointing,
    fingerprint,
    load_pretrained,
    write_predictions,
)
from workbench.tasks.classification_data import LABELS_FILE
from workbench.tasks.metrics import entity_metrics


def load_fast_tokenizer(choice: ModelChoice, task: str):
    """The model's fast tokenizer (word ids and character offsets need one); ModelError otherwise.

    Byte-level BPE tokenizers (RoBERTa, GPT-2, DeBERTa) mark a word's start with its leading
    space: words given one by one need ``add_prefix_space`` or each would look mid-sentence.
    """
    from transformers import AutoTokenizer

    tokenizer = load_pretrained(AutoTokenizer, choice)
    if getattr(tokenizer, "add_prefix_space", None) is False:
        tokenizer = load_pretrained(AutoTokenizer, choice, add_prefix_space=True)
    if not tokenizer.is_fast:
        raise ModelError(f"{choice.name_or_path!r} has only a slow (Python) tokenizer; {task} needs a fast one "
                         "for word ids and character offsets.",
                         "pick a model with a tokenizer.json (most hub models have one), or convert its "
                         "tokenizer with transformers' convert_slow_tokenizer and save it beside the model.")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


class TokenClassificationTask(FullWeights):
    """Named entities (or any tag per word) with any AutoModelForTokenClassification."""

    name = "token_classification"

    def __init__(self, settings: TrainConfig | None = None):
        self.settings = settings or TrainConfig(task="token_classification")
        self.columns: tuple[str, str] | None = None  # (tokens, tags)
        self.mapping: data.TagMapping | None = None
        self.words: dict[str, list[list[str]]] = {}  # per split, rows without words left out
        self.tags: dict[str, list[list[str]]] = {}
        self.notes: list[tuple[str, str]] = []
        self.data_fingerprint: str | None = None
        self.eval_rows: data.TokenRows | None = None
        self.predictions: list[dict] = []  # the latest evaluation's tags per sentence, saved beside the model

    # -- data ---------------------------------------------------------------------
    def check_data(self, splits) -> None:
        require_dataset_dict(splits)
        s = self.settings
        for split in SPLITS:
            ds = split_with_rows(splits.get(split), split,
                                 "pass a DatasetDict with 'train' and 'validation' splits, or a folder with "
                                 "train.* and validation.* files.")
            found = find_token_columns(ds, s.tokens_column, s.tags_column)
            if found is None:
                shown = ", ".join(c for c in ds.column_names if c != ROW_COLUMN)
                raise DataError(f"The {split} split has no word-list and tag-list columns "
                                f"({s.tokens_column or 'tokens/words'} and {s.tags_column or 'ner_tags/tags/labels'});"
                                f" its columns: {shown}.",
                                "set tokens_column and tags_column to the columns holding a list of words and a "
                                "list of tags per row, or give CoNLL files (token and tag per line).")
            if self.columns is not None and found != self.columns:
                raise DataError(f"train holds words and tags in {self.columns}, {split} in {found}.",
                                "give both splits the same columns, or set tokens_column and tags_column.")
            self.columns = found
        tokens, tag_column = self.columns
        names = data.tag_names(splits["train"], tag_column)
        locators = {split: RowLocator(splits, split) for split in SPLITS}
        for split in SPLITS:
            words, tags, empty = data.check_rows(splits[split], tokens, tag_column, split, locators[split],
                                          data.tag_names(splits[split], tag_column))
            left_out = set(empty)
            kept = [i for i in range(len(tags)) if i not in left_out]
            self.words[split] = [words[i] for i in kept]
            self.tags[split] = [tags[i] for i in kept]
            # errors below name rows as the user's file has them, not as numbered after leaving some out
            locators[split] = lambda i, k=None, at=locators[split], kept=kept: at(kept[i], k)
            if empty:
                self.notes.append((f"{len(empty)} {split} row(s) without words were left out "
                                   f"(first: {RowLocator(splits, split)(empty[0])}).", "info"))
            if not self.words[split]:
                raise DataError(f"Every row of the {split} split is empty.", "check the tokens column.")
        scheme = data.find_scheme([(tags, lambda k, i=i, split=split: locators[split](i, k))
                                   for split in SPLITS for i, tags in enumerate(self.tags[split])])
        self.mapping = data.build_mapping(self.tags["train"], names, scheme, s.subword_labels)
        known = set(self.mapping.names)
        for split in SPLITS:
            data.check_known(self.tags[split], known, split, locators[split])
        if not self.mapping.types():
            raise DataError("The train split has no entity: every tag is O.",
                            "check the tags column (tags_column) and the files: a model trained on O alone "
                            "predicts nothing.")
        self.data_fingerprint = fingerprint(splits["train"], self.columns)

    def datasets(self, splits, tokenizer, max_length: int, model=None):
        if self.mapping is None:
            self.check_data(splits)
        out = []
        for split in SPLITS:
            rows = data.tokenize(self.words[split], self.tags[split], tokenizer, self.mapping, max_length,
                                 self.settings.subword_labels)
            if rows.cut_words:
                total = sum(map(len, self.words[split]))
                self.notes.append((f"{rows.cut_words} of {total} {split} words lie past max_length={max_length} "
                                   "tokens and are cut" + (" (they count as predicted O)" if split != "train"
                                                           else "") + "; raise max_length to keep them.", "warn"))
            out.append(rows)
        self.eval_rows = out[1]
        return tuple(out)

    def collator(self, tokenizer):
        return data.collator(tokenizer.pad_token_id)

    def rows(self, batch: dict) -> int:
        return len(batch["input_ids"])

    def units(self, batch: dict) -> torch.Tensor:
        """Labelled tokens: the loss is their mean, so accumulation weights micro-batches by them."""
        return (batch["labels"] != data.IGNORE).sum()

    # -- model --------------------------------------------------------------------
    def load_tokenizer(self, choice: ModelChoice):
        return load_fast_tokenizer(choice, "token classification")

    def build_model(self, choice: ModelChoice, tokenizer, config: TrainConfig | None = None):
        from transformers import AutoModelForTokenClassification

        count = len(self.mapping.names)
        with model_checks.new_head_notice(count, announce=None, head=f"token-classification head of {count} tags") as notice:
            model = load_pretrained(AutoModelForTokenClassification, choice, num_labels=count,
                                    id2label=self.mapping.id2label, label2id=self.mapping.label2id,
                                    ignore_mismatched_sizes=True, dtype=torch.float32)
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        if getattr(config, "gradient_checkpointing", False):
            enable_gradient_checkpointing(model)
        self.notes += [(notice.message, "info")] if notice.message else []
        sample = [" ".join(w) for w in self.words["train"][:64]]
        self.notes += [(w, "warn") for w in model_checks.check_tokenizer(tokenizer, model.config, sample)]
        self.notes.append((f"Tags ({self.mapping.scheme}): {', '.join(self.mapping.names)}; labels on "
                           f"{'every sub-word' if self.settings.subword_labels == 'all' else 'the first sub-word of each word'}.",
                           "info"))
        return model

    # -- training and evaluation --------------------------------------------------
    @staticmethod
    def _inputs(batch: dict) -> dict:
        return {k: v for k, v in batch.items() if k not in ("labels", "row")}

    def loss(self, model, batch: dict) -> torch.Tensor:
        logits = model(**self._inputs(batch)).logits
        # fp32 softmax under autocast, mean over labelled tokens (what units() counts)
        return F.cross_entropy(logits.float().flatten(0, 1), batch["labels"].flatten(), ignore_index=data.IGNORE)

    def eval_outputs(self, model, batch: dict) -> tuple[torch.Tensor, ...]:
        """Per row: summed loss, labelled tokens, row index, the predicted label at every position
        (padded to max_length with -1 so every process gathers the same shape)."""
        logits = model(**self._inputs(batch)).logits.float()
        labels = batch["labels"]
        losses = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=data.IGNORE, reduction="none")
        predicted = logits.argmax(-1)
        width = self.settings.max_length
        padded = torch.full((len(labels), width), -1, dtype=predicted.dtype, device=predicted.device)
        padded[:, :predicted.shape[1]] = predicted[:, :width]
        return losses.sum(1), (labels != data.IGNORE).sum(1), batch["row"], padded

    def metrics(self, outputs: list[tuple[torch.Tensor, ...]]) -> dict[str, float]:
        summed, counts, rows, predicted = (torch.cat(parts) for parts in zip(*outputs, strict=True))
        # Each to the host once: indexing device tensors row by row syncs once per row (and per comparison).
        rows, predicted = rows.tolist(), predicted.tolist()
        order = sorted(range(len(rows)), key=rows.__getitem__)  # the file's order (DDP gathers by rank)
        rows, predicted = [rows[i] for i in order], [predicted[i] for i in order]
        gold, predictions = self.word_predictions(rows, predicted)
        self.predictions = [{"words": self.words["validation"][r], "gold": g, "predicted": p}
                            for r, g, p in zip(rows, gold, predictions, strict=True)]
        loss = (summed.double().sum() / counts.sum().clamp(min=1)).item()
        return {"eval_loss": loss, **entity_metrics(gold, predictions)}

    def baselines(self, outputs: list[tuple[torch.Tensor, ...]]) -> dict:
        """What a tagger that learned nothing scores on these sentences (the verdict's bar,
        engine/verdict.py): every word tagged O (entity F1 0, word accuracy = the share of O),
        and chance's loss, ln of the number of tags."""
        rows = sorted({int(r) for r in torch.cat([parts[2] for parts in outputs]).tolist()})
        gold = [self.tags["validation"][r] for r in rows]
        found = [{"name": "chance", "detail": f"a uniform guess over {len(self.mapping.names)} tags",
                  "metrics": {"eval_loss": math.log(max(len(self.mapping.names), 1))}}]
        if "O" in self.mapping.names and gold:
            scores = entity_metrics(gold, [["O"] * len(tags) for tags in gold])
            found.append({"name": "tagging every word O", "detail": "no entity found",
                          "metrics": {k: scores[k] for k in ("eval_precision", "eval_recall", "eval_f1",
                                                               "eval_accuracy")}})
        return {"rows": len(rows), "baselines": found}

    def word_predictions(self, rows: list[int], predicted: list[list[int]]) -> tuple[list[list[str]], list[list[str]]]:
        """(gold tags, predicted tags) per eval sentence, in the rows' order: each word's prediction
        from its first sub-word; a word cut at max_length (or without sub-words) is O."""
        names, gold, out = self.mapping.names, [], []
        for row, labels in zip(rows, predicted, strict=True):
            firsts = self.eval_rows.first_positions[row]
            gold.append(self.tags["validation"][row])
            out.append([names[labels[p]] if 0 <= p < len(labels) and labels[p] >= 0 else "O" for p in firsts])
        return gold, out

    # -- saving ---------------------------------------------------------------------
    def save_model(self, model, tokenizer, directory: Path, state_dict: dict | None = None) -> None:
        model.save_pretrained(directory, state_dict=state_dict)
        tokenizer.save_pretrained(directory)
        mapping = {"id2label": self.mapping.id2label, "label2id": self.mapping.label2id,
                   "scheme": self.mapping.scheme, "subword_labels": self.settings.subword_labels}
        (Path(directory) / LABELS_FILE).write_text(json.dumps(mapping, indent=2) + "\n", encoding="utf-8")
        write_predictions(directory, self.predictions)

    def finish(self, model_dir: Path, write_dir) -> list[tuple[str, str]]:
        return [(f"pipeline('token-classification', model={str(model_dir)!r}, aggregation_strategy='simple') "
                 "finds the entities in a text.", "info")]

    def num_classes(self) -> int | None:
        return len(self.mapping.names) if self.mapping else None

    def identity(self) -> dict:
        return {"task": self.name, "columns": list(self.columns or ()), "labels": list(self.mapping.names),
                "tag_scheme": self.mapping.scheme, "subword_labels": self.settings.subword_labels,
                "data_fingerprint": self.data_fingerprint}
