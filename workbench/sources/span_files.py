"""The two file formats of span tasks, read as they are: CoNLL text files (named entities) and
SQuAD's nested JSON (extractive question answering).

- **CoNLL** (``.conll``, ``.txt``): one token per line, its tag in the last column (columns
  separated by tabs, or by spaces when the line has no tab), a blank line between sentences,
  ``-DOCSTART-`` lines between documents. CoNLL-2003's ``eng.train`` / ``train.txt`` are this.
  Rows: ``{"tokens": [...], "ner_tags": [...]}`` with the tags as written.
- **SQuAD** (``.json`` whose top level is ``{"data": [{"title", "paragraphs": [{"context",
  "qas": [{"id", "question", "answers": [{"text", "answer_start"}], "is_impossible"}]}]}]}``,
  v1.1 and v2.0): one row per question, ``{"id", "title", "context", "question", "answers":
  {"text": [...], "answer_start": [...]}}`` as the hub's ``squad`` datasets hold them.

Each reader also says where each row sits in its file (the first token's line; a question's
JSON path and line), so an error about a row names the place to open. ``data_files.py``
chooses the reader by extension and content and keeps these places for ``RowOrigin``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from workbench.errors import DataError

CONLL_SUFFIXES = (".conll", ".txt")
CONLL_COLUMNS = ("tokens", "ner_tags")
DOCSTART = "-DOCSTART-"
SQUAD_PEEK = 1 << 16  # bytes looked at to tell SQuAD's nested JSON from records


# ---------------------------------------------------------------------------- CoNLL
def read_conll(path: str | Path) -> tuple[dict[str, list], list[int]]:
    """({"tokens": [[...]], "ner_tags": [[...]]}, the line of each sentence's first token).

    DataError with the file and line for a token without a tag, a line with another column
    count than the file's first one (a token with a space in a space-separated file), a file
    with no sentence.
    """
    path = Path(path)
    tokens: list[list[str]] = []
    tags: list[list[str]] = []
    starts: list[int] = []
    sentence: tuple[list[str], list[str]] = ([], [])
    columns: tuple[int, int] | None = None  # (count, line) of the first token line

    def close() -> None:  # the sentence so far ends here
        nonlocal sentence
        if sentence[0]:
            tokens.append(sentence[0])
            tags.append(sentence[1])
        sentence = ([], [])

    with path.open(encoding="utf-8-sig") as f:
        for number, raw in enumerate(f, start=1):
            line = raw.rstrip("\r\n")
            if not line.strip():
                close()
                continue
            parts = line.strip().split("\t") if "\t" in line else line.split()
            parts = [p.strip() for p in parts]
            if parts[0] == DOCSTART:
                close()
                continue
            if len(parts) < 2 or not parts[-1]:
                raise DataError(f"{path} line {number}: {line.strip()!r} has no tag column (a CoNLL line is "
                                "a token, optional columns, and its tag last).",
                                "give every token line a tag (O outside entities), or separate sentences "
                                "with an empty line.")
            if columns is None:
                columns = (len(parts), number)
            elif len(parts) != columns[0]:
                raise DataError(f"{path} line {number} has {len(parts)} columns ({line.strip()!r}); line "
                                f"{columns[1]} has {columns[0]}.",
                                "give every token line the same columns; a token with a space in it needs "
                                "tab-separated columns.")
            if not sentence[0]:
                starts.append(number)
            sentence[0].append(parts[0])
            sentence[1].append(parts[-1])
    close()
    if not tokens:
        raise DataError(f"{path} holds no sentence in CoNLL format.",
                        "write one 'token tag' line per token and an empty line between sentences.")
    return {"tokens": tokens, "ner_tags": tags}, starts


# ---------------------------------------------------------------------------- SQuAD
def is_squad_json(path: str | Path) -> bool:
    """Whether a .json file is SQuAD's nested layout (an object with data[].paragraphs[]),
    judged from its first bytes: JSON Lines and arrays of records start otherwise."""
    with Path(path).open("rb") as f:
        head = f.read(SQUAD_PEEK).decode("utf-8-sig", errors="replace")
    return bool(re.match(r'\s*\{', head)) and '"paragraphs"' in head and '"data"' in head


def _squad_error(path: Path, where: str, problem: str) -> DataError:
    return DataError(f"{path}: {where} {problem}.",
                     "SQuAD files hold data[].paragraphs[] with a 'context' and qas[] of "
                     "{'id', 'question', 'answers': [{'text', 'answer_start'}]}; fix that entry.")


def read_squad(path: str | Path) -> tuple[dict[str, list], list[str]]:
    """(columns of one row per question, each question's place: "data[0].paragraphs[2].qas[1] (id ...)").

    SQuAD 2.0's unanswerable questions (``is_impossible``) get empty answer lists, as on the hub.
    """
    path = Path(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as e:
        raise DataError(f"{path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}).",
                        "fix that line, or download the file again.") from None
    articles = document.get("data") if isinstance(document, dict) else None
    if not isinstance(articles, list):
        raise _squad_error(path, "the top level", "has no 'data' list")
    rows: dict[str, list] = {"id": [], "title": [], "context": [], "question": [], "answers": []}
    places: list[str] = []
    for a, article in enumerate(articles):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise _squad_error(path, f"data[{a}]", "has no 'paragraphs' list")
        for p, paragraph in enumerate(paragraphs):
            where = f"data[{a}].paragraphs[{p}]"
            if not isinstance(paragraph, dict) or not isinstance(paragraph.get("context"), str):
                raise _squad_error(path, where, "has no 'context' text")
            if not isinstance(paragraph.get("qas"), list):
                raise _squad_error(path, where, "has no 'qas' list")
            for q, qa in enumerate(paragraph["qas"]):
                at = f"{where}.qas[{q}]"
                if not isinstance(qa, dict) or not isinstance(qa.get("question"), str):
                    raise _squad_error(path, at, "has no 'question' text")
                answers = [] if qa.get("is_impossible") else qa.get("answers", [])
                if not isinstance(answers, list) or not all(
                        isinstance(x, dict) and isinstance(x.get("text"), str)
                        and isinstance(x.get("answer_start"), int) and not isinstance(x.get("answer_start"), bool)
                        for x in answers):
                    raise _squad_error(path, at, "has answers that are not [{'text': ..., 'answer_start': <int>}]")
                identifier = str(qa.get("id", f"{a}-{p}-{q}"))
                rows["id"].append(identifier)
                rows["title"].append(str(article.get("title", "")))
                rows["context"].append(paragraph["context"])
                rows["question"].append(qa["question"])
                rows["answers"].append({"text": [x["text"] for x in answers],
                                        "answer_start": [x["answer_start"] for x in answers]})
                places.append(f"{at} (id {identifier!r})")
    if not rows["id"]:
        raise _squad_error(path, "data", "holds no question")
    return rows, _with_lines(path, places, rows["id"])


def _with_lines(path: Path, places: list[str], ids: list[str]) -> list[str]:
    """Each place with the line of its question's id, when the file has lines worth naming."""
    text = path.read_text(encoding="utf-8-sig")
    if text.count("\n") < 2:  # the official files are one line: the JSON path is the place
        return places
    out, position = [], 0
    for place, identifier in zip(places, ids, strict=True):
        found = re.compile(r'"id"\s*:\s*' + re.escape(json.dumps(identifier))).search(text, position)
        if found is None:
            out.append(place)
            continue
        position = found.end()
        out.append(f"line {text.count(chr(10), 0, found.start()) + 1}, {place}")
    return out


def squad_features():
    """datasets Features of SQuAD rows (the hub's layout): typed even when every answer list is empty."""
    from datasets import Features, List, Value

    return Features({"id": Value("string"), "title": Value("string"), "context": Value("string"),
                     "question": Value("string"),
                     "answers": {"text": List(Value("string")), "answer_start": List(Value("int32"))}})


def conll_features():
    from datasets import Features, List, Value

    return Features({name: List(Value("string")) for name in CONLL_COLUMNS})
