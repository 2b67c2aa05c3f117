"""Local data files: which files make which split, checks before reading them, reading them,
and where a row of them sits (file and line).

- :func:`find_data_files` resolves a file or a folder to ``{split: [files]}``: in a folder,
  files named ``train.*`` / ``validation.*`` (or valid, val, dev) / ``test.*`` become those
  splits (the folder convention).
- :func:`load_files` reads them with ``datasets.load_dataset`` (CSV, TSV, JSON, JSON Lines,
  Parquet), or with the readers of ``span_files.py`` (CoNLL text files, SQuAD's nested JSON). Files are checked *before* ``datasets`` sees them (existence, emptiness, UTF-8,
  the delimiter, the Parquet magic bytes) because its own errors for those cases are stack
  traces from pyarrow that name neither file nor fix.
- :class:`RowOrigin` and :class:`RowLocator` turn a row's index (``ROW_COLUMN``) back into
  the file and line the user can open, so an error about a row points into their file.

A new file format (one more reader, its line numbers for ``RowOrigin``) is added here;
which split and which checks apply to the rows is ``data.py``'s and ``data_checks.py``'s.
"""

from __future__ import annotations

import codecs
import functools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.errors import DataError
from workbench.sources.paths import nearby
from workbench.sources.span_files import (
    CONLL_SUFFIXES,
    conll_features,
    is_squad_json,
    read_conll,
    read_squad,
    squad_features,
)

if TYPE_CHECKING:  # datasets is imported lazily: it takes ~1 s
    from datasets import DatasetDict

# extension -> (datasets builder, extra builder kwargs)
FORMATS: dict[str, tuple[str, dict[str, Any]]] = {
    ".csv": ("csv", {}),
    ".tsv": ("csv", {"delimiter": "\t"}),
    ".json": ("json", {}),
    ".jsonl": ("json", {}),
    ".parquet": ("parquet", {}),
    ".conll": ("conll", {}),  # span_files.py: one token per line, its tag last (CoNLL-2003)
    ".txt": ("conll", {}),  # CoNLL-2003 ships as train.txt / valid.txt / test.txt
}
TEXT_FORMATS = (".csv", ".tsv", ".json", ".jsonl", *CONLL_SUFFIXES)
# Formats read by span_files.py rather than datasets' builders: a reader and the place of each row.
OWN_READERS = {"conll": (read_conll, conll_features), "squad": (read_squad, squad_features)}

# A file in a folder whose name starts with one of these becomes that split.
SPLIT_ALIASES = {
    "train": "train", "training": "train",
    "validation": "validation", "valid": "validation", "val": "validation", "dev": "validation",
    "eval": "validation",
    "test": "test", "testing": "test",
}

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
        raise file_not_found(str(path))
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
    if builder == "json":  # SQuAD's nested JSON is not records: read by span_files.read_squad
        squad = [p.name for p in files if is_squad_json(p)]
        if squad and len(squad) < len(files):
            raise DataError(f"{path} mixes SQuAD-format JSON ({', '.join(squad)}) with JSON records.",
                            "keep one format per folder, or choose a single file.")
        builder = "squad" if squad else builder
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
    if builder in OWN_READERS:
        return _read_own_format(builder, splits)
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


def _read_own_format(builder: str, splits: dict[str, list[str]]) -> DatasetDict:
    """A DatasetDict from span_files' readers (each split's files in order, as datasets reads them)."""
    from datasets import Dataset, DatasetDict

    read, features = OWN_READERS[builder]
    out = {}
    for split, files in splits.items():
        columns: dict[str, list] = {}
        for name in files:
            rows, _ = read(name)
            for key, values in rows.items():
                columns.setdefault(key, []).extend(values)
        out[split] = Dataset.from_dict(columns, features=features())
    return DatasetDict(out)


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

def file_not_found(text: str) -> DataError:
    where = Path(text).expanduser().absolute()
    return DataError(
        f"file not found: {text} ({where} does not exist; {nearby(where, FORMATS)}).",
        f"check the path (relative paths start at {Path.cwd()}); for a hub dataset give its id,"
        " e.g. 'stanfordnlp/sst2'.",
    )


# ---------------------------------------------------------------- where a row came from
ROW_COLUMN = "__workbench_row__"  # a row's index in the file(s) of its split, from 0


@dataclass
class RowOrigin:
    """The files (or hub split) a split's rows were read from, in the order datasets read them."""

    files: list[str]
    source: str  # the data path or hub id as given
    split: str  # the split's name there

    def describe(self, index: int, word: int | None = None) -> str:
        """Row ``index`` (ROW_COLUMN) as the user finds it: "data/chats.jsonl line 8".

        ``word``: a position in the row's token list (token classification): in a CoNLL file,
        where each token has its own line, that token's line."""
        if not self.files:
            return f"{self.source} split {self.split!r} row {index}" + (f" word {word + 1}" if word is not None
                                                                      else "")
        for path in self.files:
            starts = _record_lines(Path(path))
            if index < len(starts):
                line = starts[index]
                if isinstance(line, str):  # a place that is not a line (a SQuAD question's JSON path)
                    return f"{path} {line}"
                if word is not None and line and Path(path).suffix.lower() in CONLL_SUFFIXES:
                    return f"{path} line {line + word}"
                place = f"{path} line {line}" if line else f"{path} row {index} (counting from 0)"
                return place + (f" word {word + 1}" if word is not None else "")
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

    def __call__(self, i: int, word: int | None = None) -> str:
        if self.rows is None:
            return f"{self.split} split row {i}" + (f" word {word + 1}" if word is not None else "")
        return self.origin.describe(self.rows[i], word)

    def position(self, i: int) -> int:
        return i if self.rows is None else self.rows[i]


def _record_lines(path: Path) -> list[int | str | None]:
    """The 1-based line on which each record of a data file starts (None where lines mean nothing;
    a text for a SQuAD question: its line and JSON path)."""
    stat = path.stat()
    return _record_lines_cached(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)  # an error names up to a few rows: read each file once
def _record_lines_cached(name: str, mtime_ns: int, size: int) -> list[int | str | None]:
    path = Path(name)
    suffix = path.suffix.lower()
    if suffix in CONLL_SUFFIXES:
        return list(read_conll(path)[1])
    if suffix == ".json" and is_squad_json(path):
        return list(read_squad(path)[1])
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
