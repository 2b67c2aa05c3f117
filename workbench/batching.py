"""From a text dataset to batches: label mapping, tokenization, sampling, padding.

Tokenization runs once, up front, without padding (``datasets.map``, batched).
Each batch is padded only to its own longest row (dynamic padding, by
transformers' ``DataCollatorWithPadding``), and with
``group_by_length`` rows of similar length are batched together, so little
compute is spent on pad tokens. The sampler's order depends only on (seed, epoch),
so a resumed run sees exactly the batches the interrupted one would have.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from workbench.errors import DataError

MEGABATCH_FACTOR = 50  # length grouping sorts within windows of 50 batches: random, yet little padding


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


def check_split(ds, split: str, text_columns: Sequence[str], label_column: str) -> None:
    """Columns present and at least one row, or a DataError naming what is there."""
    if ds is None:
        raise DataError(f"The dataset has no '{split}' split.",
                        "pass a DatasetDict with 'train' and 'validation' splits.")
    available = ", ".join(ds.column_names)
    for column in (*text_columns, label_column):
        if column not in ds.column_names:
            kind = "label" if column == label_column else "text"
            raise DataError(
                f"The {split} split has no {kind} column {column!r}; available columns: {available}.",
                f"pass text_columns=[...] / label_column='...' naming one of: {available}.",
            )
    if len(ds) == 0:
        raise DataError(f"The {split} split is empty (0 rows).",
                        "check the file or split name, or the max_*_rows caps.")


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


# -------------------------------------------------------------------------- sampling
class LengthGroupedBatchSampler(Sampler[list[int]]):
    """Shuffled batches of indices whose order depends only on (seed, epoch).

    With ``group_by_length``, indices are shuffled, cut into windows of
    ``MEGABATCH_FACTOR`` batches, sorted by length inside each window, batched, and
    the batches shuffled again; the batch holding the longest row comes first so
    an out-of-memory shows up at the first step, not an hour in.
    Without ``shuffle`` (evaluation) batches are taken in length order.
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, *, seed: int = 0,
                 shuffle: bool = True, group_by_length: bool = True):
        self.lengths = list(lengths)
        self.batch_size = batch_size
        self.drop_last = False  # read by Accelerate when it shards batches across processes
        self.seed = seed
        self.shuffle = shuffle
        self.group_by_length = group_by_length
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return math.ceil(len(self.lengths) / self.batch_size)

    def _batches(self, order: list[int]) -> list[list[int]]:
        return [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]

    def __iter__(self) -> Iterator[list[int]]:
        n, lengths = len(self.lengths), self.lengths
        if not self.shuffle:
            order = sorted(range(n), key=lambda i: -lengths[i]) if self.group_by_length else list(range(n))
            yield from self._batches(order)
            return
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(n, generator=generator).tolist()
        if not self.group_by_length:
            yield from self._batches(order)
            return
        window = self.batch_size * MEGABATCH_FACTOR
        batches: list[list[int]] = []
        for start in range(0, n, window):
            chunk = sorted(order[start:start + window], key=lambda i: -lengths[i])
            batches.extend(self._batches(chunk))
        batch_order = torch.randperm(len(batches), generator=generator).tolist()
        batches = [batches[i] for i in batch_order]
        longest = max(range(len(batches)), key=lambda b: lengths[batches[b][0]])
        batches[0], batches[longest] = batches[longest], batches[0]
        yield from batches


# --------------------------------------------------------------------------- loading
def default_num_workers(num_workers: int | None) -> int:
    if num_workers is not None:
        return num_workers
    # On a GPU, workers collate the next batches while the GPU computes. On a CPU they
    # compete with the model for the same cores and their fork costs seconds.
    return 2 if torch.cuda.is_available() else 0


def make_loader(dataset, batch_sampler, collate, num_workers: int | None, seed: int) -> DataLoader:
    """A DataLoader over ``batch_sampler``'s batches; ``num_workers=None``: 2 on CUDA, 0 on CPU."""
    workers = default_num_workers(num_workers)
    return DataLoader(
        dataset, batch_sampler=batch_sampler, collate_fn=collate, num_workers=workers,
        # Workers are forked once for the run, not once per epoch (each fork copies a
        # process that holds the model); they end with the loader when fit returns.
        persistent_workers=workers > 0,
        pin_memory=torch.cuda.is_available(),  # page-locked memory: faster, asynchronous copies
        # Worker seeds come from this generator, not the global RNG, so creating a
        # loader never shifts the dropout random stream (exact resume).
        generator=torch.Generator().manual_seed(seed),
    )


def step_windows(loader, sampler, accelerator, state, accumulation: int):
    """Lists of loader batches, one list per optimizer step, continuing from ``state``
    (its ``epoch`` and ``batch_in_epoch``, which the loop advances).

    The sampler order depends only on (seed, epoch) and already-seen batches are
    skipped, so a resumed run gets the same batches as an uninterrupted one.
    """
    while True:
        sampler.set_epoch(state.epoch)
        loader.set_epoch(state.epoch)
        batches = accelerator.skip_first_batches(loader, state.batch_in_epoch) if state.batch_in_epoch else loader
        window = []
        for batch in batches:
            window.append(batch)
            if len(window) == accumulation:
                yield window
                window = []
        if window:
            yield window
