"""Extractive question answering rows: answer checks, context windows and their labels, and the
post-processing that turns start/end scores back into an answer in the context's characters.

The recipe is the one of the transformers example ``run_qa.py`` and the Hugging Face course:

**Windows.** Question and context are tokenized as a pair, the context cut into windows of
``max_length`` tokens that overlap by ``doc_stride`` tokens (``return_overflowing_tokens``), so a
long context is read whole and an answer near a cut is whole in at least one window. Each
window keeps its offset mapping: for every token, the characters of the context it covers.

**Labels.** The answer's first and last characters are mapped through the offsets to the first
and last token that cover them. A window that does not hold the whole answer is labelled with
its [CLS] token at both ends: "not here". Unanswerable questions (SQuAD 2.0) are [CLS] in every
window.

**Post-processing** (``qa_pipeline.best_answer``, shared with the pipeline saved beside the
model). For every window the ``n_best`` best starts and ends (context tokens only) are paired; a pair is a candidate when the end is not before the start and the span is at most
``max_answer_length`` tokens; its score is start + end logit. The best candidate over all
windows of a question is the answer, cut from the context by the offsets. With unanswerable
questions in the data, "no answer" wins when the [CLS] score (the smallest over the windows)
beats the best span by more than ``null_score_threshold``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from workbench.errors import DataError
from workbench.tasks.base import PadToLongest, RowsDataset
from workbench.tasks.qa_pipeline import Answer, Candidates, best_answer  # noqa: F401 - re-exported

SHOWN = 3  # places named in one error
CHUNK = 1000  # questions tokenized per call


# ---------------------------------------------------------------------- checks
def check_rows(ds, question: str, context: str, answers: str, split: str, locate: Callable) -> int:
    """DataError naming the file and place of every row that cannot be trained on; returns how
    many rows are unanswerable (no answer: SQuAD 2.0).

    A row needs question and context text, and answers ``{"text": [...], "answer_start": [...]}``
    whose every text is at its ``answer_start`` in the context, character for character.
    """
    problems, unanswerable = [], 0
    for i, row in enumerate(ds.select_columns([question, context, answers])):
        q, c, a = row[question], row[context], row[answers]
        if not isinstance(q, str) or not q.strip():
            problems.append(f"{locate(i)}: the question is empty")
            continue
        if not isinstance(c, str) or not c.strip():
            problems.append(f"{locate(i)}: the context is empty")
            continue
        texts = a.get("text") if isinstance(a, dict) else None
        starts = a.get("answer_start") if isinstance(a, dict) else None
        if not isinstance(texts, list) or not isinstance(starts, list) or len(texts) != len(starts):
            problems.append(f"{locate(i)}: answers must be {{'text': [...], 'answer_start': [...]}} of one length, "
                            f"not {a!r}"[:200])
            continue
        unanswerable += not texts
        for text, start in zip(texts, starts, strict=True):
            if not isinstance(text, str) or not text.strip():
                problems.append(f"{locate(i)}: an answer is empty (an unanswerable question has no answers)")
            elif not isinstance(start, int) or not 0 <= start <= len(c) - len(text):
                problems.append(f"{locate(i)}: answer_start {start!r} of {text!r} lies outside the context "
                                f"({len(c)} characters)")
            elif c[start:start + len(text)] != text:
                where = c.find(text)
                hint = f"; it is at {where}" if where >= 0 else "; it is nowhere in the context"
                problems.append(f"{locate(i)}: the context at {start} reads {c[start:start + len(text)]!r}, not the "
                                f"answer {text!r}{hint}")
    if problems:
        more = f" (and {len(problems) - SHOWN} more)" if len(problems) > SHOWN else ""
        raise DataError(f"{len(problems)} {split} row(s) cannot be trained on: {'; '.join(problems[:SHOWN])}{more}.",
                        "give each row a question, a context and answers whose answer_start is the character "
                        "where the answer text starts in the context (0-based); fix or drop those rows.")
    return unanswerable


# ---------------------------------------------------------------------- windows
def answer_tokens(offsets: list[tuple[int, int]], in_context: list[bool], start_char: int,
                  end_char: int) -> tuple[int, int] | None:
    """(first token, last token) of the answer ``[start_char, end_char)`` in one window, or None
    when the window's context does not hold all of it."""
    context = [i for i, inside in enumerate(in_context) if inside]
    if not context:
        return None
    first, last = context[0], context[-1]
    if offsets[first][0] > start_char or offsets[last][1] < end_char:
        return None
    start = first
    while start <= last and offsets[start][0] <= start_char:
        start += 1
    end = last
    while end >= first and offsets[end][1] >= end_char:
        end -= 1
    return start - 1, end + 1


class Windows(RowsDataset):
    """The windows of a split: model inputs and labels, plus what post-processing needs."""

    def __init__(self, columns: dict[str, list], example: list[int], offsets: list[np.ndarray]):
        super().__init__(columns, "feature")
        self.example = example  # per window: the row (question) it came from
        self.offsets = offsets  # per window: (tokens, 2) context characters, -1 outside; evaluation only


def make_windows(questions: list[str], contexts: list[str], answers: list[dict], tokenizer, max_length: int,
                 stride: int, keep_offsets: bool) -> Windows:
    """Every question's windows with start/end labels (the first answer; [CLS] where it is not
    whole in the window). ``keep_offsets``: also the offsets and the context mask for evaluation."""
    question_first = tokenizer.padding_side == "right"  # XLNet-style models put the context first
    cls_id = tokenizer.cls_token_id
    columns: dict[str, list] = {"input_ids": [], "start_positions": [], "end_positions": []}
    example: list[int] = []
    offsets_out: list[np.ndarray] = []
    for begin in range(0, len(questions), CHUNK):
        qs = [q.lstrip() for q in questions[begin:begin + CHUNK]]  # leading spaces waste the window
        cs = contexts[begin:begin + CHUNK]
        encoded = tokenizer(qs if question_first else cs, cs if question_first else qs,
                            truncation="only_second" if question_first else "only_first", max_length=max_length,
                            stride=stride, return_overflowing_tokens=True, return_offsets_mapping=True,
                            padding=False)
        context_side = 1 if question_first else 0
        for i, ids in enumerate(encoded["input_ids"]):
            row = begin + encoded["overflow_to_sample_mapping"][i]
            in_context = [s == context_side for s in encoded.sequence_ids(i)]
            offsets = encoded["offset_mapping"][i]
            cls = ids.index(cls_id) if cls_id in ids else 0
            texts, starts = answers[row]["text"], answers[row]["answer_start"]
            span = answer_tokens(offsets, in_context, starts[0], starts[0] + len(texts[0])) if texts else None
            start, end = span if span is not None else (cls, cls)
            columns["input_ids"].append(ids)
            columns["start_positions"].append(start)
            columns["end_positions"].append(end)
            if "token_type_ids" in encoded:
                columns.setdefault("token_type_ids", []).append(encoded["token_type_ids"][i])
            if keep_offsets:
                columns.setdefault("context_mask", []).append([int(x) for x in in_context])
                columns.setdefault("cls_index", []).append(cls)
                offsets_out.append(np.array([o if inside else (-1, -1) for o, inside in zip(offsets, in_context,
                                                                                            strict=True)],
                                            dtype=np.int32).reshape(-1, 2))
            example.append(row)
    return Windows(columns, example, offsets_out)


def question_room(questions: list[str], tokenizer, max_length: int, stride: int) -> list[tuple[int, int]]:
    """(row, question tokens) of every question too long to leave more than ``stride`` tokens of
    context in a window: the tokenizer cannot make overlapping windows for those."""
    specials = tokenizer.num_special_tokens_to_add(pair=True)
    # verbose=False: a question longer than the model's positions is what this looks for, not a warning
    lengths = tokenizer([q.lstrip() for q in questions], add_special_tokens=False, verbose=False)["input_ids"]
    return [(i, len(ids)) for i, ids in enumerate(lengths) if max_length - specials - len(ids) <= stride]


def collator(pad_id: int) -> PadToLongest:
    """Pads ids with the pad id, token types and the context mask with 0."""
    return PadToLongest({"input_ids": pad_id, "token_type_ids": 0, "context_mask": 0})


# ------------------------------------------------------------------- post-processing
# Candidates, Answer and best_answer come from qa_pipeline.py, the pipeline saved beside the
# model (standalone, so that it can travel with the weights): evaluation and a reload pick the
# same span.


def top_candidates(logits: torch.Tensor, mask: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions, logits) of the ``k`` best context positions per row, padded to exactly ``k``
    with -inf (so every batch and every process returns the same shape)."""
    masked = logits.masked_fill(~mask, -math.inf)
    values, positions = masked.topk(min(k, masked.shape[1]), dim=1)
    if values.shape[1] < k:
        pad = k - values.shape[1]
        values = torch.cat([values, values.new_full((len(values), pad), -math.inf)], dim=1)
        positions = torch.cat([positions, positions.new_zeros((len(positions), pad))], dim=1)
    return positions, values
