"""Token-classification rows: their tags, the tag scheme, and labels aligned to sub-words.

A row is a list of words and a tag per word (``["EU", "rejects", "German", "call"]``,
``["B-ORG", "O", "B-MISC", "O"]``); tags are strings, or integers with names (a hub dataset's
``ClassLabel``). The tokenizer splits words into sub-words ("Gonzalez" -> "Gon", "##zal",
"##ez"), so the word tags must be aligned to sub-words:

- ``all`` (the default, the Hugging Face course's choice): every sub-word carries a tag,
  continuing the entity: a B-PER word's later pieces are I-PER (for IOBES an S-PER word
  becomes B-PER ... E-PER). The model then tags every piece the way
  ``pipeline("token-classification", aggregation_strategy="simple")`` joins them back into
  words and entities; trained on first pieces only, it may start a new entity mid-word there.
- ``first`` (the BERT paper's and ``run_ner.py``'s default): the word's first sub-word carries
  its tag, the others get -100 and no loss.

Evaluation is always per word, from the first sub-word's prediction: a word the tokenizer
cut away at ``max_length`` (or that has no sub-word) counts as predicted ``O``, so the
scores never silently skip the ends of long sentences.

Tag schemes: IOB1 (an entity starts with I-, B- only between two adjacent entities of a
type), IOB2 (every entity starts with B-) and IOBES (plus E- for the last word, S- for a
single-word one). A dataset uses one; a mix (an entity that starts with I- in a file where
others start with B-) is an error naming both places.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from workbench.errors import DataError
from workbench.tasks.base import PadToLongest, RowsDataset
from workbench.tasks.classification_data import LabelMapping

IGNORE = -100  # label of a position without loss (special tokens, later sub-words with "first")
PREFIXES = ("B", "I", "E", "S")
SHOWN = 3  # places named in one error


# ---------------------------------------------------------------------------- tags
def split_tag(tag: str) -> tuple[str, str] | None:
    """("B", "PER") for "B-PER", ("O", "") for "O"; None for a tag in no scheme."""
    if tag == "O":
        return "O", ""
    prefix, dash, kind = tag.partition("-")
    if dash and prefix in PREFIXES and kind:
        return prefix, kind
    return None


def tag_order(tag: str) -> tuple:
    """O first, then by entity type, B before I before E before S: readable label ids."""
    parts = split_tag(tag) or ("", tag)
    return (parts[0] != "O", parts[1], PREFIXES.index(parts[0]) if parts[0] in PREFIXES else 9)


@dataclass
class TagMapping(LabelMapping):
    """Tag names by label id (``values`` are the names: tags are their own values), and the scheme."""

    scheme: str = "IOB2"  # IOB1 | IOB2 | IOBES

    def types(self) -> list[str]:
        return sorted({split_tag(n)[1] for n in self.names if split_tag(n) and split_tag(n)[0] != "O"})


def tag_names(ds, tags_column: str) -> list[str] | None:
    """The names of integer tags (a ``ClassLabel`` inside the list feature); None for string tags."""
    feature = ds.features[tags_column]
    inner = getattr(feature, "feature", None)  # List(ClassLabel(...)) / Sequence(ClassLabel(...))
    return list(inner.names) if inner is not None and hasattr(inner, "names") else None


def check_rows(ds, tokens_column: str, tags_column: str, split: str, locate: Callable,
               names: list[str] | None) -> tuple[list[list[str]], list[list[str]], list[int]]:
    """Every row's words, its tags as strings, and the rows to leave out (no words at all).

    DataError naming the file and line (``locate``) of: words and tags of different lengths,
    a word that is not text, an integer tag outside the names, a tag in no scheme.
    """
    problems: list[tuple[int, str]] = []  # (row, text)
    words_out: list[list[str]] = []
    tags_out: list[list[str]] = []
    empty: list[int] = []
    for i, row in enumerate(ds.select_columns([tokens_column, tags_column])):
        words, tags = row[tokens_column], row[tags_column]
        words_out.append(words)
        if not isinstance(words, list) or not isinstance(tags, list):
            problems.append((i, f"{locate(i)}: {tokens_column!r} and {tags_column!r} must be lists, not "
                                f"{type(words).__name__} and {type(tags).__name__}"))
            tags_out.append([])
            continue
        if len(words) != len(tags):
            problems.append((i, f"{locate(i)}: {len(words)} words but {len(tags)} tags"))
            tags_out.append([])
            continue
        if not words:
            empty.append(i)
        strings = []
        for k, (word, tag) in enumerate(zip(words, tags, strict=True)):
            if not isinstance(word, str) or not word.strip():
                problems.append((i, f"{locate(i, k)}: word {word!r} is not text"))
            if names is not None:
                if not isinstance(tag, int) or not 0 <= tag < len(names):
                    problems.append((i, f"{locate(i, k)} ({word!r}): tag {tag!r} is not one of the {len(names)} tag ids"))
                    tag = "O"
                else:
                    tag = names[tag]
            elif not isinstance(tag, str):
                problems.append((i, f"{locate(i, k)} ({word!r}): tag {tag!r} is an integer without names"))
                tag = "O"
            if split_tag(tag) is None:
                problems.append((i, f"{locate(i, k)} ({word!r}): tag {tag!r} is not O or B-/I-/E-/S- plus a type"))
            strings.append(tag)
        tags_out.append(strings)
    if problems:
        shown = "; ".join(text for _, text in problems[:SHOWN])
        more = f" (and {len(problems) - SHOWN} more)" if len(problems) > SHOWN else ""
        raise DataError(f"{len(problems)} problem(s) in the {split} split: {shown}{more}.",
                        "give each word one tag (O outside entities; B-TYPE / I-TYPE inside, or E-/S- for "
                        "IOBES); integer tags need their names (a ClassLabel feature), else write them as "
                        "text.")
    return words_out, tags_out, empty


def find_scheme(sequences: Sequence[tuple[list[str], Callable[[int], str]]]) -> str:
    """IOB1, IOB2 or IOBES from the tag sequences (each with the ``place(word)`` of its words).

    DataError when the sequences mix schemes, naming a place of each kind.
    """
    evidence: dict[str, str] = {}  # kind -> first place seen
    for tags, place in sequences:
        parts = [split_tag(t) for t in tags]
        for k, (prefix, kind) in enumerate(parts):
            before = parts[k - 1] if k else ("O", "")
            after = parts[k + 1] if k + 1 < len(parts) else ("O", "")
            continues = before[1] == kind and before[0] in ("B", "I")
            if prefix in ("E", "S"):
                evidence.setdefault("IOBES", place(k))
            elif prefix == "I" and not continues:
                evidence.setdefault("IOB1", place(k))  # an entity that starts with I-
            elif prefix == "B" and not continues:
                evidence.setdefault("IOB2", place(k))  # B- after O: IOB2 (and IOBES)
            if prefix in ("B", "I") and not (after[1] == kind and after[0] in ("I", "E")):
                evidence.setdefault("ends-inside", place(k))  # IOBES ends an entity with E- or S-
    if "IOBES" in evidence:
        clash = next((k for k in ("IOB1", "ends-inside") if k in evidence), None)
        if clash:
            what = {"IOB1": "an entity that starts with I- (IOB1)",
                    "ends-inside": "an entity that ends with B- or I- (IOB1/IOB2)"}[clash]
            raise _mixed(f"E-/S- tags (IOBES) at {evidence['IOBES']} and {what} at {evidence[clash]}")
        return "IOBES"
    if "IOB1" in evidence and "IOB2" in evidence:
        raise _mixed(f"an entity that starts with I- (IOB1) at {evidence['IOB1']} and one that starts with "
                     f"B- after O (IOB2) at {evidence['IOB2']}")
    return "IOB1" if "IOB1" in evidence else "IOB2"


def _mixed(found: str) -> DataError:
    return DataError(f"The tags mix schemes: {found}.",
                     "convert every file to one scheme: IOB2 (each entity starts with B-, continues with I-) "
                     "is what most datasets use; seqeval.scheme or a few lines of Python convert IOB1 and "
                     "IOBES to it.")


def build_mapping(train_tags: list[list[str]], names: list[str] | None, scheme: str,
                  subword_labels: str) -> TagMapping:
    """Label ids: a ClassLabel's names as given, else train's tags (O first, by type); with
    ``subword_labels="all"`` also the tags later sub-words need (I-X for every type, and for
    IOBES B-/E- too)."""
    tags = list(names) if names is not None else sorted({t for seq in train_tags for t in seq}, key=tag_order)
    if subword_labels == "all":
        kinds = sorted({split_tag(t)[1] for t in tags if split_tag(t) and split_tag(t)[0] != "O"})
        needed = ("B", "I", "E") if scheme == "IOBES" else ("I",)
        tags += [f"{p}-{k}" for k in kinds for p in needed if f"{p}-{k}" not in tags]
        if names is None:  # a ClassLabel's ids stay as given; ids made here stay in the readable order
            tags.sort(key=tag_order)
    return TagMapping(values=list(tags), names=tags, scheme=scheme)


def check_known(tags: list[list[str]], known: set[str], split: str, locate: Callable) -> None:
    """DataError for tags that train never has (the model would have no output for them)."""
    unknown = [(i, k, t) for i, seq in enumerate(tags) for k, t in enumerate(seq) if t not in known]
    if unknown:
        shown = "; ".join(f"{locate(i, k)}: {t!r}" for i, k, t in unknown[:SHOWN])
        raise DataError(f"The {split} split has {len(unknown)} tag(s) that the train split never uses: {shown}.",
                        f"fix those tags, or add train sentences with them (train's tags: "
                        f"{', '.join(sorted(known, key=tag_order))}).")


# ---------------------------------------------------------------------- alignment
def subword_tags(tag: str, pieces: int, scheme: str, subword_labels: str) -> list[str | None]:
    """The tags of one word's ``pieces`` sub-words; None: no loss there.

    ``first``: the tag, then None. ``all``: the entity continues through the pieces
    (B-X -> B-X I-X ...; IOBES S-X -> B-X I-X ... E-X, E-X -> I-X ... E-X).
    """
    if subword_labels == "first" or pieces == 1:
        return [tag] + [None] * (pieces - 1)
    prefix, kind = split_tag(tag)
    if prefix == "O":
        return ["O"] * pieces
    if scheme == "IOBES" and prefix in ("S", "E"):
        first = "B" if prefix == "S" else "I"
        return [f"{first}-{kind}"] + [f"I-{kind}"] * (pieces - 2) + [f"E-{kind}"]
    return [tag] + [f"I-{kind}"] * (pieces - 1)


def align_labels(word_ids: list[int | None], tags: list[str], label2id: dict[str, int], scheme: str,
                 subword_labels: str) -> tuple[list[int], list[int]]:
    """(a label per token, the position of each word's first sub-word or -1) for one tokenized row.

    ``word_ids`` is the fast tokenizer's map from token to word (None for [CLS], [SEP]).
    """
    first_position = [-1] * len(tags)
    pieces: dict[int, list[int]] = {}
    for position, word in enumerate(word_ids):
        if word is not None:
            pieces.setdefault(word, []).append(position)
    labels = [IGNORE] * len(word_ids)
    for word, positions in pieces.items():
        first_position[word] = positions[0]
        for position, tag in zip(positions, subword_tags(tags[word], len(positions), scheme, subword_labels),
                                 strict=True):
            labels[position] = IGNORE if tag is None else label2id[tag]
    return labels, first_position


# ---------------------------------------------------------------------- tokenized
class TokenRows(RowsDataset):
    """Token ids and labels per row, and where each word's prediction is read."""

    def __init__(self, columns: dict[str, list], first_positions: list[list[int]], cut_words: int):
        super().__init__(columns, "row")
        self.first_positions = first_positions  # per row: each word's first sub-word, -1 when cut away
        self.cut_words = cut_words  # words beyond max_length (they count as predicted O)


def tokenize(words: list[list[str]], tags: list[list[str]], tokenizer, mapping: TagMapping, max_length: int,
             subword_labels: str) -> TokenRows:
    """One fast-tokenizer pass over the words (``is_split_into_words``), cut at ``max_length``."""
    columns: dict[str, list] = {"input_ids": [], "labels": []}
    firsts, cut = [], 0
    label2id = mapping.label2id
    for start in range(0, len(words), 1000):
        encoded = tokenizer(words[start:start + 1000], is_split_into_words=True, truncation=True,
                            max_length=max_length, padding=False)
        for j, ids in enumerate(encoded["input_ids"]):
            i = start + j
            labels, first = align_labels(encoded.word_ids(j), tags[i], label2id, mapping.scheme, subword_labels)
            columns["input_ids"].append(ids)
            columns["labels"].append(labels)
            if "token_type_ids" in encoded:
                columns.setdefault("token_type_ids", []).append(encoded["token_type_ids"][j])
            firsts.append(first)
            cut += sum(p < 0 for p in first)
    return TokenRows(columns, firsts, cut)


def collator(pad_id: int) -> PadToLongest:
    """Pads ids with the pad id and labels with -100 (no loss on padding)."""
    return PadToLongest({"input_ids": pad_id, "labels": IGNORE, "token_type_ids": 0})


# ---------------------------------------------------------------------- error analysis
def entity_spans(tags: list[str]) -> list[tuple[str, int, int]]:
    """(type, first word, last word) of each entity, by seqeval's (conlleval's) reading of the tags."""
    from seqeval.metrics.sequence_labeling import get_entities

    return [(kind, start, end) for kind, start, end in get_entities(list(tags))]


def entity_errors(words: list[str], gold: list[str], predicted: list[str]) -> list[dict]:
    """What a prediction got wrong in one sentence, one dict per entity: ``error`` is "missed" (no
    prediction overlaps it), "wrong type" (same words, other type), "wrong boundary" (overlaps,
    other words) or "spurious" (predicted where the reference has none)."""
    expected, found = entity_spans(gold), entity_spans(predicted)
    sentence = " ".join(words)

    def text(a: int, b: int) -> str:
        return " ".join(words[a:b + 1])

    def overlaps(x, y) -> bool:
        return x[1] <= y[2] and y[1] <= x[2]

    out = []
    for entity in expected:
        if entity in found:
            continue
        same = [f for f in found if (f[1], f[2]) == (entity[1], entity[2])]
        near = [f for f in found if overlaps(f, entity)]
        error = "wrong type" if same else "wrong boundary" if near else "missed"
        guess = (same or near or [None])[0]
        out.append({"sentence": sentence, "entity": text(entity[1], entity[2]), "expected": entity[0],
                    "predicted": f"{guess[0]}: {text(guess[1], guess[2])}" if guess else "", "error": error})
    for entity in found:
        if entity not in expected and not any(overlaps(entity, e) for e in expected):
            out.append({"sentence": sentence, "entity": text(entity[1], entity[2]), "expected": "",
                        "predicted": entity[0], "error": "spurious"})
    return out
