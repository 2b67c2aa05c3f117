"""Loading a dataset choice into ``train`` + ``validation`` splits.

Everything the dataset picker does is here as plain functions, so papermill runs,
``workbench train`` and ``fit(DatasetChoice)`` behave exactly like the widget:

- :func:`resolve_data_source` tells a local path from a hub id for a bare string.
- :func:`load_raw` reads a hub dataset (:func:`load_hub`) or local files
  (``data_files.load_files``: CSV, TSV, JSON, JSON Lines, Parquet, or a folder of them)
  and returns every split.
- :func:`load_choice` (classification) adds the column and label checks of
  ``data_checks.py``, the stratified validation split when there is no eval split, and the
  row caps; :func:`load_splits` (tasks that check their own columns, e.g. a causal LM)
  keeps every column and each row's origin in the user's file.

Every bad input raises :class:`~workbench.errors.DataError` whose message says what
is wrong and whose ``fix`` says what to do. A new task's way of loading (its own columns,
its own checks) is one more function here beside ``load_choice`` and ``load_splits``.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.config import DatasetChoice
from workbench.errors import DataError
from workbench.sources.data_checks import check_columns, check_labels, label_values
from workbench.sources.data_files import (
    FORMATS,
    MISSING_MARKERS,
    ROW_COLUMN,
    RowOrigin,
    file_not_found,
    find_data_files,
    load_files,
)
from workbench.sources.hub import is_offline
from workbench.sources.paths import looks_like_local_path

if TYPE_CHECKING:  # datasets is imported lazily: it takes ~1 s
    from datasets import Dataset, DatasetDict


# ---------------------------------------------------------------- the source: hub or files


def _datasets_offline() -> bool:
    """datasets' own switch (HF_DATASETS_OFFLINE), read by datasets itself."""
    try:
        from datasets import config

        return bool(config.HF_HUB_OFFLINE)
    except (ImportError, AttributeError):
        return False


# datasets 4 stopped running loading scripts; the Hub's dataset viewer keeps a Parquet copy of
# every public dataset on this branch, which is what such a dataset (eriktks/conll2003) loads from.
PARQUET_EXPORT = "refs/convert/parquet"


def load_hub(name: str, config_name: str | None = None) -> DatasetDict:
    """Load a hub dataset (all splits); offline or unknown names become a DataError.

    A dataset that is still a loading script (which datasets 4 no longer runs) is read from
    the Hub's Parquet export of it instead.
    """
    import datasets

    try:
        try:
            loaded = datasets.load_dataset(name, config_name)
        except RuntimeError as script:
            if "scripts are no longer supported" not in str(script):
                raise
            loaded = datasets.load_dataset(name, config_name, revision=PARQUET_EXPORT)
    except Exception as e:
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        offline = is_offline() or _datasets_offline()
        hint = (
            "the hub is switched off here (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE); load it once"
            " where the hub is reachable so it is cached, or point to local files."
            if offline or "offline" in text.lower()
            else "check the name and config on the hub (e.g. 'stanfordnlp/sst2'), your network"
            " and HF_TOKEN for gated datasets, or point to local files."
        )
        raise DataError(f"could not load hub dataset {name!r}"
                        f"{f' (config {config_name!r})' if config_name else ''}: {text}", hint) from None
    if not isinstance(loaded, datasets.DatasetDict):
        loaded = datasets.DatasetDict(train=loaded)
    return loaded


def resolve_data_source(path: str | os.PathLike) -> str:
    """``"files"`` or ``"hub"`` for a bare ``data`` string; DataError for a missing local path.

    An existing file or folder is ``"files"``. A string that cannot be a hub dataset id
    (see :func:`workbench.sources.paths.looks_like_local_path`: a path mark or a data file
    extension) and does not exist is a file that is not there, said as such; only a
    plausible hub id (``stanfordnlp/sst2``, ``imdb``) is ``"hub"``.
    """
    text = str(path).strip()
    if not text:
        raise DataError("no dataset given.", "pass a file or folder path, or a hub dataset id.")
    if Path(text).expanduser().exists():
        return "files"
    if isinstance(path, os.PathLike) or looks_like_local_path(text, FORMATS):
        raise file_not_found(text)
    return "hub"


def load_raw(choice: DatasetChoice, *, csv_as_text: bool = False) -> DatasetDict:
    """Every split of the chosen source, unchecked (for the picker's preview)."""
    if choice.source == "files":
        return load_files(choice.path, csv_as_text=csv_as_text)
    if looks_like_local_path(choice.path, FORMATS) and not Path(choice.path).expanduser().exists():
        raise file_not_found(choice.path)  # not a hub id: the hub's "offline" error would mislead
    return load_hub(choice.path, choice.config_name)


# ---------------------------------------------------------------- train and validation


def stratified_split(ds: Dataset, label_column: str, fraction: float, seed: int) -> tuple[Dataset, Dataset]:
    """Split ``fraction`` of ``ds`` off as validation, keeping class proportions.

    ``datasets``' ``train_test_split(stratify_by_column=...)`` accepts only a
    ClassLabel column, so labels are encoded into a temporary ClassLabel column and
    the original one (strings, ints) is kept unchanged.
    """
    from datasets import ClassLabel

    values = label_values(ds, label_column)
    classes = sorted({str(v) for v in values})
    counts = Counter(str(v) for v in values)
    rare = [c for c, n in counts.items() if n < 2]
    if rare:
        raise DataError(
            f"class(es) {', '.join(map(repr, rare))} have a single row, so a stratified validation"
            " split cannot hold them.",
            "add rows for those classes, remove them, or provide a validation file.",
        )
    n_eval = round(len(values) * fraction)
    if n_eval < len(classes) or len(values) - n_eval < len(classes):
        raise DataError(
            f"validation_fraction={fraction} of {len(values)} rows gives {n_eval} validation rows,"
            f" too few for {len(classes)} classes.",
            "raise validation_fraction, add rows, or provide a validation file.",
        )
    stratum = "__workbench_stratum__"
    tagged = ds.add_column(stratum, [classes.index(str(v)) for v in values])
    tagged = tagged.cast_column(stratum, ClassLabel(names=classes))
    parts = tagged.train_test_split(test_size=n_eval, stratify_by_column=stratum, seed=seed)
    return parts["train"].remove_columns(stratum), parts["test"].remove_columns(stratum)


def _is_csv(choice: DatasetChoice) -> bool:
    """Whether the choice is CSV/TSV files (a folder holds one format; load_raw checked that)."""
    if choice.source != "files":
        return False
    path = Path(choice.path).expanduser()
    files = [path] if path.is_file() else [p for p in path.iterdir() if p.is_file()]
    return any(p.suffix.lower() in (".csv", ".tsv") for p in files)


def _cap(ds: Dataset, limit: int | None, seed: int) -> Dataset:
    if limit is None or ds.num_rows <= limit:
        return ds
    return ds.shuffle(seed=seed).select(range(limit)).flatten_indices()


def load_choice(choice: DatasetChoice) -> DatasetDict:
    """Load and check a DatasetChoice: a DatasetDict with ``train`` and ``validation``.

    Keeps only the chosen text and label columns, labels as written (names or ints;
    hub ClassLabel columns stay ClassLabel). When ``choice.eval_split`` is None or is
    the default ``"validation"`` and absent, a stratified ``validation_fraction`` of
    train (seed ``choice.seed``) becomes the validation split. Raises DataError.
    """
    from datasets import DatasetDict

    raw = load_raw(choice)
    train = _train_split(raw, choice)
    markers = MISSING_MARKERS if _is_csv(choice) else ()
    check_columns(train, choice.text_columns, choice.label_column, choice.train_split)
    classes = check_labels(train, choice.label_column, choice.train_split, markers)
    keep = [*dict.fromkeys([*choice.text_columns, choice.label_column])]

    eval_split = _eval_split_name(raw, choice)
    if eval_split is None:
        train, validation = stratified_split(train, choice.label_column,
                                             choice.validation_fraction, choice.seed)
    else:
        validation = raw[eval_split]
        check_columns(validation, choice.text_columns, choice.label_column, eval_split)
        eval_classes = check_labels(validation, choice.label_column, eval_split, markers, min_classes=1)
        if type(eval_classes[0]) is not type(classes[0]):
            raise DataError(
                f"labels are {type(classes[0]).__name__} in train but "
                f"{type(eval_classes[0]).__name__} in {eval_split!r}.",
                "use the same kind of label in every split.",
            )
        unseen = [c for c in eval_classes if c not in classes]
        if unseen:
            raise DataError(
                f"split {eval_split!r} has labels that train does not: "
                f"{', '.join(map(repr, unseen[:10]))}.",
                "check that both splits use the same label names or numbers.",
            )
    train = _cap(train.select_columns(keep), choice.max_train_rows, choice.seed)
    validation = _cap(validation.select_columns(keep), choice.max_eval_rows, choice.seed)
    return DatasetDict(train=train, validation=validation)


def _train_split(raw: DatasetDict, choice: DatasetChoice) -> Dataset:
    if choice.train_split not in raw:
        raise DataError(f"there is no split {choice.train_split!r}; available splits: {', '.join(raw)}.",
                        "set train_split to one of them.")
    return raw[choice.train_split]


def _eval_split_name(raw: DatasetDict, choice: DatasetChoice) -> str | None:
    """The eval split to use; None: split one off train (no eval split, or the default one absent)."""
    eval_split = choice.eval_split
    if eval_split is not None and eval_split not in raw:
        if eval_split != "validation":
            raise DataError(f"there is no split {eval_split!r}; available splits: {', '.join(raw)}.",
                            "set eval_split to one of them, or to None for a split off train.")
        return None
    return eval_split


def load_splits(choice: DatasetChoice) -> DatasetDict:
    """``train`` and ``validation`` of a DatasetChoice for a task without labels (a causal LM).

    All columns are kept and nothing is checked here: the task knows which columns it
    reads (chat messages, prompt/completion, text) and checks them. Without an eval
    split, a random ``validation_fraction`` of train (seed ``choice.seed``) becomes one.

    Each row keeps its index in what the user gave (``ROW_COLUMN``) and the result's
    ``origins`` ({split: RowOrigin}) turns that index into a file and line, so an error
    about a row points into the user's file, not into the shuffled split made from it.
    """
    from datasets import DatasetDict

    raw = load_raw(choice, csv_as_text=True)  # "004" and "2.50" are answers as written, not numbers
    files = find_data_files(choice.path)[2] if choice.source == "files" else {}
    train = _train_split(raw, choice)
    train = train.add_column(ROW_COLUMN, list(range(train.num_rows)))
    origins = {"train": RowOrigin(files.get(choice.train_split, []), choice.path, choice.train_split)}
    eval_split = _eval_split_name(raw, choice)
    if eval_split is None:
        if train.num_rows < 2:
            raise DataError(f"split {choice.train_split!r} has {train.num_rows} row(s): too few to split a "
                            "validation set off.", "add rows, or give an eval split.")
        parts = train.train_test_split(test_size=choice.validation_fraction, seed=choice.seed)
        train, validation = parts["train"], parts["test"]
        origins["validation"] = origins["train"]
    else:
        validation = raw[eval_split]
        validation = validation.add_column(ROW_COLUMN, list(range(validation.num_rows)))
        origins["validation"] = RowOrigin(files.get(eval_split, []), choice.path, eval_split)
    splits = DatasetDict(train=_cap(train, choice.max_train_rows, choice.seed),
                         validation=_cap(validation, choice.max_eval_rows, choice.seed))
    splits.origins = origins
    return splits
