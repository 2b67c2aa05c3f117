"""A classification dataset's labels and tokens: label mapping and one tokenization pass.

Tokenization runs once, up front, without padding (``datasets.map``, batched); the
engine's sampler (``engine/batching.py``) groups rows of similar length and the collator
pads each batch only to its own longest row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch.utils.data import Dataset

from workbench.errors import DataError

LABELS_FILE = "labels.json"  # beside the saved model: ids <-> label names (result_from_disk reads it)

# ---------------------------------------------------------------------------- labels
@dataclass
class LabelMapping:
    """Class ids <-> label values. ``values[i]`` is how class i appears in the data."""

    values: list
    names: list[str]

    @property
    def id2label(self) -> dict[int, str]:
        return dict(enumerate(self.names))

    @property
    def label2id(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.names)}

    def value_to_id(self) -> dict:
        return {value: i for i, value in enumerate(self.values)}


def build_label_mapping(train, evaluation, label_column: str) -> LabelMapping:
    """Label values of the train split -> ids; eval values outside them are a DataError.

    A ``ClassLabel`` column keeps its names and ids. Otherwise the distinct values
    are sorted (strings alphabetically, numbers numerically) and numbered from 0.
    """
    feature = train.features.get(label_column)
    if feature is not None and hasattr(feature, "names") and hasattr(feature, "num_classes"):
        values, names = list(range(feature.num_classes)), list(feature.names)
    else:
        train_values = set(train.unique(label_column))
        if None in train_values:
            raise DataError(f"The train split has empty (None) values in label column {label_column!r}.",
                            "drop or fill those rows before training.")
        try:
            values = sorted(train_values)
        except TypeError:  # mixed types: sort by text so the order is still stable
            values = sorted(train_values, key=str)
        if len(values) < 2:
            raise DataError(
                f"Label column {label_column!r} has only one value ({values!r}) in the train split.",
                "classification needs at least two classes; check the label column.",
            )
        names = [str(v) for v in values]
    known = set(values)
    unknown = [v for v in evaluation.unique(label_column) if v not in known]
    if unknown:
        shown = ", ".join(repr(v) for v in sorted(unknown, key=str)[:5])
        raise DataError(
            f"The validation split has label values never seen in train: {shown} "
            f"(train labels: {', '.join(repr(v) for v in values[:10])}).",
            "fix or drop those rows, or use a split whose labels are a subset of train's.",
        )
    return LabelMapping(values=values, names=names)


# ---------------------------------------------------------------------- tokenization
class TokenizedDataset(Dataset):
    """Token ids (unpadded) and class ids, held as Python lists for cheap batching."""

    def __init__(self, input_ids: list[list[int]], labels: list[int],
                 token_type_ids: list[list[int]] | None = None):
        self.input_ids = input_ids
        self.labels = labels
        self.token_type_ids = token_type_ids
        self.lengths = [len(ids) for ids in input_ids]

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, index: int) -> dict:
        row = {"input_ids": self.input_ids[index], "labels": self.labels[index]}
        if self.token_type_ids is not None:
            row["token_type_ids"] = self.token_type_ids[index]
        return row


def tokenize(ds, tokenizer, text_columns: Sequence[str], label_column: str,
             labels: LabelMapping, max_length: int, token_types: bool | None = None) -> TokenizedDataset:
    """One batched ``datasets.map`` pass: truncate to ``max_length``, never pad.

    ``token_types``: ask for segment ids of sentence pairs even when the tokenizer
    does not return them by default (True for BERT-like models, type_vocab_size > 1).
    """
    pairs = len(text_columns) == 2
    extra = {"return_token_type_ids": True} if pairs and token_types else {}
    value_to_id = labels.value_to_id()

    def encode(batch):
        texts = [batch[c] for c in text_columns]
        for column, values in zip(text_columns, texts, strict=True):
            if any(v is None for v in values):
                raise DataError(f"Text column {column!r} has empty (None) values.",
                                "drop or fill those rows before training.")
        encoded = tokenizer(*texts, truncation=True, max_length=max_length, padding=False, **extra)
        out = {"input_ids": encoded["input_ids"],
               "labels": [value_to_id[v] for v in batch[label_column]]}
        # Segment ids matter for pairs only; a tokenizer returns them only when its model takes them.
        if pairs and "token_type_ids" in encoded:
            out["token_type_ids"] = encoded["token_type_ids"]
        return out

    mapped = ds.map(encode, batched=True, remove_columns=ds.column_names, desc="Tokenizing")
    columns = mapped.with_format(None)[:]
    return TokenizedDataset(columns["input_ids"], columns["labels"], columns.get("token_type_ids"))
