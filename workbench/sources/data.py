"""Loading a dataset choice into ``train`` + ``validation`` splits, with checks that explain.

Everything the dataset picker does is here as plain functions, so papermill runs,
``workbench train`` and ``fit(DatasetChoice)`` behave exactly like the widget:

- :func:`load_raw` reads a hub dataset or local files (CSV, TSV, JSON, JSON Lines,
  Parquet, or a folder of them) with ``datasets.load_dataset`` and returns every split.
- :func:`load_choice` adds the column and label checks, the stratified validation
  split when there is no eval split, and the row caps.
- :func:`suggest_columns`, :func:`column_types`, :func:`preview_rows` and
  :func:`label_distribution` feed the picker's choosers, table and chart.

- :func:`resolve_data_source` tells a local path from a hub id for a bare string.

Every bad input raises :class:`~workbench.errors.DataError` whose message says what
is wrong and whose ``fix`` says what to do. Files are checked *before* ``datasets``
sees them (existence, emptiness, UTF-8, the Parquet magic bytes) because its own
errors for those cases are stack traces from pyarrow that name neither file nor fix.

Why one module of ~700 lines: loading and checking share the reading details (CSV/TSV
cells read as written, missing-label markers, the split names); the checks are pure functions
after the loaders. The next split is loaders (hub, files) apart from the checks.
"""

from __future__ import annotations

import codecs
import functools
import json
import os
import re
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.config import DatasetChoice
from workbench.errors import DataError
from workbench.sources.hub import is_offline
from workbench.sources.paths import looks_like_local_path, nearby

if TYPE_CHECKING:  # datasets is imported lazily: it takes ~1 s
    from datasets import Dataset, DatasetDict

# extension -> (datasets builder, extra builder kwargs)
FORMATS: dict[str, tuple[str, dict[str, Any]]] = {
    ".csv": ("csv", {}),
    ".tsv": ("csv", {"delimiter": "\t"}),
    ".json": ("json", {}),
    ".jsonl": ("json", {}),
    ".parquet": ("parquet", {}),
}
TEXT_FORMATS = (".csv", ".tsv", ".json", ".jsonl")

# A file in a folder whose name starts with one of these becomes that split.
SPLIT_ALIASES = {
    "train": "train", "training": "train",
    "validation": "validation", "valid": "validation", "val": "validation", "dev": "validation",
    "eval": "validation",
    "test": "test", "testing": "test",
}

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

UTF8_CHUNK = 1 << 20  # bytes per read when checking the encoding

# CSV/TSV cells are read as written: only a blank cell is missing. pandas' default also
# turns "NA", "N/A", "None", "null", "nan"... into nulls, which silently drops real text
# ("NA" the band, "None of it worked") and then blames the rows for being empty.
CSV_READ_OPTIONS = {"keep_default_na": False, "na_values": [""]}
# The strings pandas would have read as missing. In a *label* column they still mean
# "no label" (an R or spreadsheet export writes NA there), so they are reported as such.
MISSING_MARKERS = frozenset({
    "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
    "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null",
})
HEADER_PEEK = 1 << 16  # bytes read to find the header line


# ---------------------------------------------------------------- file checks


def check_utf8(path: str | os.PathLike) -> None:
    """Raise DataError naming the byte offset of the first byte that is not UTF-8."""
    path = Path(path)
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with path.open("rb") as f:
        while True:
            chunk = f.read(UTF8_CHUNK)
            final = not chunk
            try:
                decoder.decode(chunk, final=final)
            except UnicodeDecodeError as e:
                # e.start counts from the bytes the decoder held back plus this chunk
                held = len(decoder.getstate()[0]) if not final else 0
                bad = max(0, offset + e.start - held)
                with path.open("rb") as g:
                    g.seek(bad)
                    snippet = g.read(4)
                raise DataError(
                    f"{path} is not UTF-8 text: byte {bad} (0x{snippet[:1].hex()}) cannot be decoded"
                    f" (next bytes {snippet!r}).",
                    f"re-encode the file as UTF-8, e.g. `iconv -f latin1 -t utf-8 {path.name}"
                    f" > {path.stem}.utf8{path.suffix}` (use the encoding it was written in),"
                    " or save it as 'CSV UTF-8' from your spreadsheet program.",
                ) from None
            if final:
                return
            offset += len(chunk)


def check_file(path: str | os.PathLike) -> str:
    """Check one data file before loading; return its extension. Raises DataError."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise DataError(
            f"{path} has the extension {suffix or '(none)'!r}, which the workbench does not read.",
            "use one of " + ", ".join(FORMATS) + " (rename the file if its content is one of them).",
        )
    if not path.exists():
        raise DataError(f"{path} does not exist.", "check the path (relative paths start at "
                        f"{Path.cwd()}).")
    if path.stat().st_size == 0:
        raise DataError(f"{path} is empty (0 bytes).", "write the data again or choose another file.")
    if suffix in TEXT_FORMATS:
        check_utf8(path)
        if suffix in (".csv", ".tsv"):
            check_delimiter(path)
    elif suffix == ".parquet":
        with path.open("rb") as f:
            head = f.read(4)
            f.seek(max(0, path.stat().st_size - 4))
            tail = f.read(4)
        if head != b"PAR1" or tail != b"PAR1":
            raise DataError(
                f"{path} is not a Parquet file (it lacks the 'PAR1' marker at its start and end).",
                "write it again with pandas.DataFrame.to_parquet or Dataset.to_parquet, or give the"
                " file the extension that matches its content.",
            )
    return suffix


def check_delimiter(path: str | os.PathLike) -> None:
    """A .csv whose header is tab-separated (or a .tsv with commas) is refused with a rename.

    The extension decides how the file is read, here as in the picker, run.yaml and
    pandas, so a mismatch is reported rather than guessed around: read as CSV, a TSV
    is one column named "text\\tlabel", or pandas' "Expected 1 fields in line 14, saw 2"
    at the first text with a comma in it. Only the header line is looked at: text
    cells may hold any character, the column names rarely do.
    """
    path = Path(path)
    with path.open("rb") as f:
        head = f.read(HEADER_PEEK)
    header = head.decode("utf-8-sig", errors="replace").splitlines()[0] if head.strip() else ""
    suffix = path.suffix.lower()
    if suffix == ".csv" and "," not in header and "\t" in header:
        raise DataError(
            f"{path} looks tab-separated (its header {header!r} has tabs and no commas), but it is"
            " named .csv, so it would be read as a single column.",
            f"rename it to {path.with_suffix('.tsv').name} (`mv {path} {path.with_suffix('.tsv')}`),"
            " or save it comma-separated.",
        )
    if suffix == ".csv" and "," not in header and ";" in header:
        raise DataError(
            f"{path} looks semicolon-separated (its header {header!r} has semicolons and no"
            " commas), as spreadsheets write CSV in locales with a decimal comma.",
            "export it again with commas as the separator, or as tab-separated text named .tsv.",
        )
    if suffix == ".tsv" and "\t" not in header and "," in header:
        raise DataError(
            f"{path} looks comma-separated (its header {header!r} has commas and no tabs), but it"
            " is named .tsv, so it would be read as a single column.",
            f"rename it to {path.with_suffix('.csv').name} (`mv {path} {path.with_suffix('.csv')}`).",
        )


def _json_problem(path: Path) -> str | None:
    """Where a .json/.jsonl file stops being JSON (a document or one object per line)."""
    text = path.read_text(encoding="utf-8")
    try:
        json.loads(text)
        return None
    except json.JSONDecodeError as whole:
        if path.suffix.lower() == ".json" and text.lstrip().startswith("["):
            return f"line {whole.lineno}, column {whole.colno}: {whole.msg}"
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            json.loads(line)
        except json.JSONDecodeError as e:
            return f"line {number}, column {e.colno}: {e.msg}"
    return None


# ---------------------------------------------------------------- loading


def find_data_files(path: str | os.PathLike) -> tuple[str, dict[str, Any], dict[str, list[str]]]:
    """Resolve a file or folder to (builder, builder kwargs, {split: [files]}).

    A folder's files named ``train.*`` / ``validation.*`` (or valid, val, dev) /
    ``test.*`` become those splits (``train-00000-of-00002.parquet`` counts as train);
    when no file name says a split, all files are ``train``.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise _not_found(str(path))
    if path.is_file():
        files = [path]
    else:
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in FORMATS)
        if not files:
            others = sorted(p.name for p in path.iterdir())[:8]
            raise DataError(
                f"{path} holds no data file ({', '.join(FORMATS)}); it has: "
                f"{', '.join(others) or 'nothing'}.",
                "put train.csv (and validation.csv) or similar files in the folder.",
            )
    suffixes = {check_file(p) for p in files}
    builders = {(FORMATS[s][0], json.dumps(FORMATS[s][1])) for s in suffixes}
    if len(builders) > 1:
        raise DataError(
            f"{path} mixes data formats ({', '.join(sorted(suffixes))}).",
            "keep one format per folder, or choose a single file.",
        )
    builder, kwargs = FORMATS[files[0].suffix.lower()]
    splits: dict[str, list[str]] = {}
    for p in files:
        first = re.split(r"[-_.]", p.name.lower(), maxsplit=1)[0]
        split = SPLIT_ALIASES.get(first)
        if split:
            splits.setdefault(split, []).append(str(p))
    if not splits or len(files) == 1:
        splits = {"train": [str(p) for p in files]}
    else:
        unnamed = [p.name for p in files if str(p) not in sum(splits.values(), [])]
        if unnamed:
            raise DataError(
                f"{path} has files named for splits and others that are not: {', '.join(unnamed)}.",
                "name every file train.*, validation.* or test.*, or move the others away.",
            )
    return builder, dict(kwargs), splits


def load_files(path: str | os.PathLike, *, csv_as_text: bool = False) -> DatasetDict:
    """Load a local file or folder into a DatasetDict, one entry per split.

    ``csv_as_text``: every CSV/TSV column is read as the text written ("004", "2.50" stay so),
    not typed as numbers by pandas: what a language model trains on is the text.
    """
    import datasets

    builder, kwargs, splits = find_data_files(path)
    if builder == "csv":
        kwargs.setdefault("encoding", "utf-8-sig")  # a spreadsheet's BOM must not join the header
        for key, value in CSV_READ_OPTIONS.items():
            kwargs.setdefault(key, value)
        if csv_as_text:
            import csv

            first = Path(next(iter(splits.values()))[0])
            with first.open(encoding="utf-8-sig", newline="") as f:
                header = next(csv.reader(f, delimiter=kwargs.get("delimiter", ",")), [])
            kwargs["features"] = datasets.Features({name: datasets.Value("string") for name in header})
    try:
        loaded = datasets.load_dataset(builder, data_files=splits, **kwargs)
    except Exception as e:  # pyarrow/pandas raise many types; each becomes one clear message
        raise _load_error(builder, splits, e) from None
    for split, ds in loaded.items():
        if ds.num_rows == 0:
            raise DataError(
                f"split {split!r} ({', '.join(splits[split])}) has no rows.",
                "add data rows below the header, or remove the file.",
            )
    return loaded


def _load_error(builder: str, splits: dict[str, list[str]], error: Exception) -> DataError:
    files = [Path(f) for names in splits.values() for f in names]
    if "corresponds to no data" in str(error):  # datasets' words for a split without rows
        return DataError(f"{', '.join(map(str, files))} has no data rows.",
                         "add rows below the header, or choose another file.")
    if builder == "json":
        for f in files:
            problem = _json_problem(f)
            if problem:
                return DataError(
                    f"{f} is not valid JSON or JSON Lines ({problem}).",
                    "fix that line; JSON Lines needs one complete object per line, .json one"
                    " array of objects (or JSON Lines).",
                )
    reason = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
    cause = error.__cause__ or error.__context__
    if cause is not None and str(cause).strip():
        reason = str(cause).strip().splitlines()[-1]
    kind = {"csv": "CSV/TSV", "json": "JSON", "parquet": "Parquet"}[builder]
    return DataError(
        f"could not read {', '.join(str(f) for f in files)} as {kind}: {reason}",
        "check that the content matches the extension (every row with the same number of"
        " fields for CSV/TSV) and that the file is complete.",
    )


def _datasets_offline() -> bool:
    """datasets' own switch (HF_DATASETS_OFFLINE), read by datasets itself."""
    try:
        from datasets import config

        return bool(config.HF_HUB_OFFLINE)
    except (ImportError, AttributeError):
        return False


def load_hub(name: str, config_name: str | None = None) -> DatasetDict:
    """Load a hub dataset (all splits); offline or unknown names become a DataError."""
    import datasets

    try:
        loaded = datasets.load_dataset(name, config_name)
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
        raise _not_found(text)
    return "hub"


def _not_found(text: str) -> DataError:
    where = Path(text).expanduser().absolute()
    return DataError(
        f"file not found: {text} ({where} does not exist; {nearby(where, FORMATS)}).",
        f"check the path (relative paths start at {Path.cwd()}); for a hub dataset give its id,"
        " e.g. 'stanfordnlp/sst2'.",
    )


def load_raw(choice: DatasetChoice, *, csv_as_text: bool = False) -> DatasetDict:
    """Every split of the chosen source, unchecked (for the picker's preview)."""
    if choice.source == "files":
        return load_files(choice.path, csv_as_text=csv_as_text)
    if looks_like_local_path(choice.path, FORMATS) and not Path(choice.path).expanduser().exists():
        raise _not_found(choice.path)  # not a hub id: the hub's "offline" error would mislead
    return load_hub(choice.path, choice.config_name)


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


def check_split(ds: Dataset | None, split: str, text_columns: Sequence[str], label_column: str, *,
                min_classes: int = 2) -> list[Any]:
    """Everything a split of classification data must be: present, with rows, the columns,
    texts to read and usable labels (``check_columns`` and ``check_labels``); its classes."""
    if ds is None:
        raise DataError(f"The dataset has no '{split}' split.",
                        "pass a DatasetDict with 'train' and 'validation' splits.")
    if len(ds) == 0:  # first: the columns of an empty split have no types to check
        raise DataError(f"The {split} split is empty (0 rows).",
                        "check the file or split name, or the max_*_rows caps.")
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


# ---------------------------------------------------------------- where a row came from
ROW_COLUMN = "__workbench_row__"  # a row's index in the file(s) of its split, from 0


@dataclass
class RowOrigin:
    """The files (or hub split) a split's rows were read from, in the order datasets read them."""

    files: list[str]
    source: str  # the data path or hub id as given
    split: str  # the split's name there

    def describe(self, index: int) -> str:
        """Row ``index`` (ROW_COLUMN) as the user finds it: "data/chats.jsonl line 8"."""
        if not self.files:
            return f"{self.source} split {self.split!r} row {index}"
        for path in self.files:
            starts = _record_lines(Path(path))
            if index < len(starts):
                line = starts[index]
                return f"{path} line {line}" if line else f"{path} row {index} (counting from 0)"
            index -= len(starts)
        return f"{self.files[-1]} row {index}"


class RowLocator:
    """Rows of ``splits[split]`` as the user finds them: ``locate(i)`` is the file and line when
    the splits came from ``load_splits``, else the split's own row index (a DatasetDict the
    user built: its rows are what they see); ``position(i)`` orders rows as the file does."""

    def __init__(self, splits, split: str):
        ds = splits[split]
        self.split = split
        self.origin = getattr(splits, "origins", {}).get(split)
        self.rows = list(ds[ROW_COLUMN]) if self.origin is not None and ROW_COLUMN in ds.column_names else None

    def __call__(self, i: int) -> str:
        return f"{self.split} split row {i}" if self.rows is None else self.origin.describe(self.rows[i])

    def position(self, i: int) -> int:
        return i if self.rows is None else self.rows[i]



def _record_lines(path: Path) -> list[int | None]:
    """The 1-based line on which each record of a data file starts (None where lines mean nothing)."""
    stat = path.stat()
    return _record_lines_cached(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)  # an error names up to a few rows: read each file once
def _record_lines_cached(name: str, mtime_ns: int, size: int) -> list[int | None]:
    path = Path(name)
    suffix = path.suffix.lower()
    if suffix == ".jsonl" or (suffix == ".json" and not path.read_text(encoding="utf-8").lstrip().startswith("[")):
        with path.open(encoding="utf-8") as f:
            return [n for n, line in enumerate(f, start=1) if line.strip()]
    if suffix in (".csv", ".tsv"):
        import csv

        with path.open(encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f, delimiter="\t" if suffix == ".tsv" else ",")
            starts, end = [], 0
            for record in reader:
                if any(cell.strip() for cell in record):
                    starts.append(end + 1)
                end = reader.line_num
            return starts[1:]  # the header is not a row
    if suffix == ".json":
        return [None] * len(json.loads(path.read_text(encoding="utf-8")))
    import pyarrow.parquet as pq

    return [None] * pq.ParquetFile(path).metadata.num_rows
