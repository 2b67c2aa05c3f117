"""What a classification dataset's columns must be: the checks on columns, texts, labels
and splits, and the column facts the dataset picker shows beside them.

- :func:`require_dataset_dict` and :func:`split_with_rows`: the data is a DatasetDict whose
  train and validation splits have rows (every task's first checks).
- :func:`check_split` (``check_columns``, ``check_texts``, ``check_labels``): a split is
  present, has rows, the chosen columns, text to read in every text cell and usable labels;
  each failure is a :class:`~workbench.errors.DataError` that names the column, the rows and
  the fix.
- :func:`suggest_columns`, :func:`column_types`, :func:`preview_rows` and
  :func:`label_distribution` feed the picker's choosers, table and chart.
- :func:`detect_task` says which task the columns are for (a run's ``task="auto"`` and the
  picker): question answering, token classification, a causal LM's chats, or classification;
  :func:`find_token_columns` finds the words and tags of token-classification data.

Pure functions of a loaded ``datasets.Dataset``: reading files is ``data_files.py``'s job.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from workbench.errors import DataError

if TYPE_CHECKING:  # datasets is imported lazily: it takes ~1 s
    from datasets import Dataset, DatasetDict

# Column-name guesses, best first. Pairs come before singles so that an NLI file
# with premise/hypothesis is offered as a pair.
TEXT_PAIRS = [
    ("sentence1", "sentence2"), ("premise", "hypothesis"), ("question", "sentence"),
    ("question", "context"), ("question1", "question2"), ("text1", "text2"),
    ("text_a", "text_b"), ("query", "passage"),
]
TEXT_NAMES = [
    "text", "sentence", "review", "content", "document", "body", "comment", "tweet",
    "utterance", "question", "title", "input", "prompt", "abstract", "description",
]
LABEL_NAMES = [
    "label", "labels", "sentiment", "class", "target", "category", "y", "intent", "topic",
    "rating", "stars", "emotion",
]
# Token classification: a list of words and a list of tags per row (CoNLL-2003 on the hub: tokens,
# ner_tags; WNUT-17 and many others: tokens, tags). The first name present is taken.
TOKEN_NAMES = ["tokens", "words"]
TAG_NAMES = ["ner_tags", "tags", "labels", "ner", "label"]

# ---------------------------------------------------------------- which task


def find_token_columns(ds: Dataset, tokens_column: str | None = None,
                       tags_column: str | None = None) -> tuple[str, str] | None:
    """(tokens column, tags column) of token-classification data: the given names, or the first of
    TOKEN_NAMES / TAG_NAMES whose first value is a list; None when the data has no such pair."""
    columns = list(ds.column_names)
    first = ds[0] if len(ds) else {}

    def pick(given, names):
        if given is not None:
            return given if given in columns else None
        return next((n for n in names if n in columns and isinstance(first.get(n), list)), None)

    tokens, tags = pick(tokens_column, TOKEN_NAMES), pick(tags_column, TAG_NAMES)
    return (tokens, tags) if tokens and tags else None


def detect_task(ds: Dataset, question_column: str = "question", context_column: str = "context",
                answers_column: str = "answers") -> str:
    """The task whose data ``ds`` looks like, from its columns and first row.

    question + context + answers: ``question_answering``; a list of words and a list of tags:
    ``token_classification``; chosen + rejected answers: ``preference``; chat messages or prompt + completion: ``causal_lm``; anything
    else: ``classification`` (whose own checks then name the columns it needs).
    """
    columns = set(ds.column_names)
    if {question_column, context_column, answers_column} <= columns:
        return "question_answering"
    if find_token_columns(ds):
        return "token_classification"
    if {"chosen", "rejected"} <= columns:  # TRL's preference columns (prompt optional)
        return "preference"
    first = ds[0] if len(ds) else {}
    chats = any(isinstance(v, list) and v and all(isinstance(m, dict) and "role" in m for m in v)
                for v in first.values())
    if chats or {"prompt", "completion"} <= columns:
        return "causal_lm"
    return "classification"

# ---------------------------------------------------------------- columns and labels


def suggest_columns(column_names: Iterable[str]) -> tuple[tuple[str, ...], str | None]:
    """Guess (text_columns, label_column) from column names; ((), None) when nothing fits."""
    names = list(column_names)
    lower = {n.lower(): n for n in names}
    label = next((lower[n] for n in LABEL_NAMES if n in lower), None)
    for a, b in TEXT_PAIRS:
        if a in lower and b in lower:
            return (lower[a], lower[b]), label
    for n in TEXT_NAMES:
        if n in lower:
            return (lower[n],), label
    return (), label


def column_types(ds: Dataset) -> dict[str, str]:
    """Column name -> readable type (``string``, ``int64``, ``ClassLabel(neg, pos)``...)."""
    from datasets import ClassLabel, Value

    out = {}
    for name, feature in ds.features.items():
        if isinstance(feature, ClassLabel):
            out[name] = f"ClassLabel({', '.join(feature.names)})"
        elif isinstance(feature, Value):
            out[name] = "string" if feature.dtype in ("string", "large_string") else feature.dtype
        else:
            out[name] = type(feature).__name__
    return out


def preview_rows(ds: Dataset, n: int = 5) -> list[dict[str, Any]]:
    """The first ``n`` rows as dicts (labels shown as names for ClassLabel columns)."""
    from datasets import ClassLabel

    rows = ds.select(range(min(n, ds.num_rows))).to_list()
    for name, feature in ds.features.items():
        if isinstance(feature, ClassLabel):
            for row in rows:
                if row[name] is not None and row[name] >= 0:
                    row[name] = feature.int2str(row[name])
    return rows


def check_columns(ds: Dataset, text_columns: Sequence[str], label_column: str,
                  split: str = "train") -> None:
    """Each chosen column exists, text columns hold strings without gaps."""
    available = list(ds.column_names)
    for column in [*text_columns, label_column]:
        if column not in available:
            raise DataError(
                f"column {column!r} is not in split {split!r}; available columns: "
                f"{', '.join(available)}.",
                "choose one of the available columns (text_columns / label_column).",
            )
    types = column_types(ds)
    for column in text_columns:
        if types[column] != "string":
            raise DataError(
                f"text column {column!r} holds {types[column]}, not text.",
                f"choose a text column; columns with text here: "
                f"{', '.join(c for c, t in types.items() if t == 'string') or 'none'}.",
            )
    check_texts(ds, text_columns, split)


SPLITS = ("train", "validation")  # what every task trains and evaluates on
SPLITS_HINT = "pass a DatasetDict with 'train' and 'validation' splits."


def require_dataset_dict(splits) -> None:
    """``splits`` is a mapping of split names (a DatasetDict); else a DataError saying what to pass."""
    if not hasattr(splits, "keys"):
        raise DataError(f"data must be a DatasetDict with 'train' and 'validation' splits, "
                        f"not {type(splits).__name__}.",
                        "pass a DatasetDict, a DatasetChoice, or a path to local files.")


def split_with_rows(ds: Dataset | None, split: str, hint: str = SPLITS_HINT) -> Dataset:
    """``ds``, the split named ``split``, present and with rows; else a DataError. ``hint``: how
    to pass the split, in the task's words (its files, what the split is for)."""
    if ds is None:
        raise DataError(f"The dataset has no '{split}' split.", hint)
    if len(ds) == 0:  # before any column check: the columns of an empty split have no types
        raise DataError(f"The {split} split is empty (0 rows).",
                        "check the file or split name, or the max_*_rows caps.")
    return ds


def check_split(ds: Dataset | None, split: str, text_columns: Sequence[str], label_column: str, *,
                min_classes: int = 2) -> list[Any]:
    """Everything a split of classification data must be: present, with rows, the columns,
    texts to read and usable labels (``check_columns`` and ``check_labels``); its classes."""
    ds = split_with_rows(ds, split)
    check_columns(ds, text_columns, label_column, split)
    return check_labels(ds, label_column, split, min_classes=min_classes)


def check_texts(ds: Dataset, text_columns: Sequence[str], split: str = "train") -> None:
    """Every text cell holds something to read: no nulls, no empty or whitespace-only strings.

    Such a row trains as ``[CLS] [SEP]`` with a real label: silent noise the model
    learns as "no words means class X". Counted with Arrow compute, so a million rows
    cost milliseconds and nothing is copied into Python.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    def blanks(values):
        if pa.types.is_null(values.type):  # every value missing: Arrow could not even type it
            return pa.chunked_array([pa.array([True] * len(values))])
        trimmed = pc.utf8_trim_whitespace(values)
        return pc.fill_null(pc.or_kleene(pc.is_null(values), pc.equal(trimmed, "")), True)

    for column in text_columns:
        # First over the whole table underneath (a select()/shuffle() view keeps it all):
        # milliseconds, and clean data stops here. Only when it has blanks are the view's
        # own rows taken out (seconds for a shuffled million rows) to count exactly.
        values = ds.data.column(column)
        if not (pa.types.is_null(values.type) or pa.types.is_string(values.type)
                or pa.types.is_large_string(values.type)):
            raise DataError(f"text column {column!r} holds {values.type}, not text, in split {split!r}.",
                            "choose the column that holds the text (text_columns).")
        blank = blanks(values)
        if not pc.any(blank).as_py():
            continue
        values = ds.select_columns([column]).with_format("arrow")[:][column]
        blank = blanks(values)
        count = pc.sum(blank).as_py() or 0
        if count:
            rows = pc.indices_nonzero(blank.combine_chunks()).to_pylist()[:5]
            nulls = values.null_count
            parts = [f"{nulls} missing"] if nulls else []
            parts += [f"{count - nulls} empty or whitespace-only"] if count - nulls else []
            kinds = " and ".join(parts)
            raise DataError(
                f"text column {column!r} has {count} value(s) with no text in split {split!r}"
                f" ({kinds}; first at row(s) {', '.join(map(str, rows))}, counting from 0).",
                "fill or drop those rows before training, e.g."
                f" ds = ds.filter(lambda r: r[{column!r}] is not None and r[{column!r}].strip()).",
            )


def label_values(ds: Dataset, label_column: str) -> list[Any]:
    """Label values as written (ClassLabel ints become their names)."""
    from datasets import ClassLabel

    feature = ds.features[label_column]
    values = ds[label_column]
    if isinstance(feature, ClassLabel):
        return [feature.int2str(v) if v is not None and v >= 0 else None for v in values]
    return list(values)


def _is_integer_text(value: str) -> bool:
    return bool(re.fullmatch(r"\s*[-+]?\d+\s*", value))


def check_labels(ds: Dataset, label_column: str, split: str = "train",
                 missing_markers: Collection[str] = (), *, min_classes: int = 2) -> list[Any]:
    """Labels are one type, without gaps, with at least ``min_classes`` classes; returns the
    sorted classes. A training split needs two; a small eval split may hold one.

    ``missing_markers``: strings that mean "no label" here (``MISSING_MARKERS`` for CSV/TSV,
    whose cells are read as written).
    """
    from datasets import ClassLabel, Value

    feature = ds.features[label_column]
    values = label_values(ds, label_column)
    missing = sum(v is None for v in values)
    markers = Counter(v for v in values if isinstance(v, str) and v in missing_markers)
    if missing or markers:
        written = ""
        if markers:
            written = " (" + ", ".join(f"{n} written as {m!r}" for m, n in markers.most_common(3)) + ")"
        raise DataError(
            f"label column {label_column!r} has {missing + sum(markers.values())} empty value(s)"
            f" in split {split!r}{written}.",
            "give every row a label, or drop unlabeled rows before training"
            + (f"; if {markers.most_common(1)[0][0]!r} really is a class, rename it in the file"
               " (e.g. 'not_applicable')." if markers else "."),
        )
    kinds = sorted({type(v).__name__ for v in values})
    if not isinstance(feature, (ClassLabel, Value)) or len(kinds) > 1:
        examples = {}
        for v in values:
            examples.setdefault(type(v).__name__, v)
        raise DataError(
            f"label column {label_column!r} mixes value types in split {split!r}: "
            + ", ".join(f"{k} (e.g. {examples[k]!r})" for k in kinds)
            + ".",
            "use one kind of label throughout: all names (\"positive\") or all integers (1).",
        )
    if isinstance(feature, Value) and feature.dtype in ("string", "large_string"):
        numeric = [v for v in values if _is_integer_text(v)]
        if numeric and len(numeric) < len(values):
            word = next(v for v in values if not _is_integer_text(v))
            raise DataError(
                f"label column {label_column!r} mixes numbers and names in split {split!r} "
                f"(e.g. {numeric[0]!r} and {word!r}).",
                "use one kind of label throughout: all names or all integers.",
            )
    if (isinstance(feature, Value) and feature.dtype.startswith("float")
            and any(float(v) != int(v) for v in values)):
            raise DataError(
                f"label column {label_column!r} holds fractional numbers; this looks like regression.",
                "sequence classification needs class labels: integers or names.",
            )
    classes = sorted(set(values), key=lambda v: (str(type(v)), v))
    if len(classes) < min_classes:
        raise DataError(
            f"label column {label_column!r} has a single class ({classes[0]!r}) in split {split!r}.",
            "a classifier needs at least two classes: check the label column, or that the file"
            " was not filtered or sorted and cut.",
        )
    return classes


def label_distribution(splits: DatasetDict | dict[str, Dataset], label_column: str) -> dict[str, dict[Any, int]]:
    """{split: {label: rows}}, labels sorted; splits without the column are skipped."""
    out = {}
    for split, ds in splits.items():
        if label_column in ds.column_names:
            counts = Counter(label_values(ds, label_column))
            out[split] = dict(sorted(counts.items(), key=lambda kv: (str(type(kv[0])), str(kv[0]))))
    return out
