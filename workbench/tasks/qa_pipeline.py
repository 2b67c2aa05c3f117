"""Extractive question answering as a transformers pipeline, and the post-processing behind it.

transformers 5 removed its ``"question-answering"`` pipeline (its REMOVED_TASKS point to chat
models), while extractive models still load with ``AutoModelForQuestionAnswering``. So a model
the workbench fine-tunes for question answering carries this file: it is copied beside the
weights and named in ``config.json`` (``custom_pipelines``), and

    from transformers import pipeline
    qa = pipeline("question-answering", model="outputs/qa/model", trust_remote_code=True)
    qa(question="Where was Marie Curie born?", context="Marie Curie was born in Warsaw in 1867.")
    # {'answer': 'Warsaw', 'score': 0.93, 'start': 24, 'end': 30}

loads it with nothing but transformers, torch and numpy installed. ``trust_remote_code=True``
is transformers' consent to run a pipeline file from the model folder: this one, which you can
read there. Its defaults (window length, stride, longest answer, "no answer" for SQuAD 2.0
models) are the run's, saved in ``config.json`` as ``question_answering``.

``best_answer`` is also what the workbench's evaluation uses (``question_answering_data``), so
the pipeline picks the span the run was scored on: the best start + end logit over every
window of the context. ``score`` is that span's probability in its window (softmax of the
start and end logits over the context and [CLS]), as transformers 4's pipeline reported it.

Standalone on purpose: this file imports numpy, torch and transformers only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from transformers.pipelines.base import ChunkPipeline

# What the pipeline does when config.json says nothing (run_qa.py's defaults).
DEFAULTS = {"max_seq_len": 384, "doc_stride": 128, "max_answer_len": 30, "n_best": 20,
            "handle_impossible_answer": False, "null_score_threshold": 0.0}


# ----------------------------------------------------------------------- post-processing
@dataclass
class Candidates:
    """One window's post-processing input: its top starts and ends (token, logit), its [CLS]
    score and its offsets (characters of the context per token; -1 outside the context)."""

    starts: list[tuple[int, float]]
    ends: list[tuple[int, float]]
    null_score: float
    offsets: np.ndarray


@dataclass
class Answer:
    text: str  # "" for "no answer"
    score: float  # start + end logit (for "no answer": the smallest [CLS] score)
    start: int | None = None  # characters of the context, end exclusive
    end: int | None = None
    window: int | None = None  # which window the span (or the smallest [CLS] score) is in
    tokens: tuple[int, int] | None = None  # its start and end token there


def best_answer(windows: list[Candidates], context: str, max_answer_length: int, *, allow_null: bool = False,
                null_threshold: float = 0.0) -> Answer:
    """The best span over all windows of one question.

    A start and an end pair up when both are context tokens, the end is not before the start
    and the span is at most ``max_answer_length`` tokens; the score is the sum of their logits.
    ``allow_null`` (SQuAD 2.0): "no answer" when the smallest [CLS] score of the windows beats
    the best span by more than ``null_threshold``.
    """
    best: tuple[float, int, int, int, int, int] | None = None  # score, chars, window, tokens
    for w, window in enumerate(windows):
        offsets = window.offsets
        for i, start_logit in window.starts:
            if i >= len(offsets) or offsets[i][0] < 0 or not math.isfinite(start_logit):
                continue
            for j, end_logit in window.ends:
                if j >= len(offsets) or offsets[j][0] < 0 or not math.isfinite(end_logit):
                    continue
                if j < i or j - i + 1 > max_answer_length:
                    continue
                score = start_logit + end_logit
                if best is None or score > best[0]:
                    best = (score, int(offsets[i][0]), int(offsets[j][1]), w, i, j)
    null_window = min(range(len(windows)), key=lambda w: windows[w].null_score, default=None)
    null = windows[null_window].null_score if null_window is not None else -math.inf
    if allow_null and (best is None or null - best[0] > null_threshold):
        return Answer("", null, window=null_window)
    if best is None:
        return Answer("", -math.inf)
    score, start, end, w, i, j = best
    return Answer(context[start:end], score, start, end, w, (i, j))


def top_positions(logits: np.ndarray, mask: np.ndarray, k: int) -> list[tuple[int, float]]:
    """(position, logit) of the ``k`` best positions where ``mask`` is true, best first."""
    masked = np.where(mask, logits, -np.inf)
    order = np.argsort(-masked, kind="stable")[:k]
    return [(int(i), float(masked[i])) for i in order if np.isfinite(masked[i])]


def _softmax(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    masked = np.where(mask, logits, -np.inf)
    shifted = np.exp(masked - masked.max())
    return shifted / shifted.sum()


# ---------------------------------------------------------------------------- the pipeline
class ExtractiveQuestionAnsweringPipeline(ChunkPipeline):
    """question + context -> ``{"answer", "score", "start", "end"}``, one dict per question.

    Call it as transformers 4's pipeline: ``qa(question=..., context=...)``, ``qa({"question":
    ..., "context": ...})`` or with a list of such dicts (a list of answers). Settings per call
    or at creation: ``max_seq_len``, ``doc_stride``, ``max_answer_len``, ``n_best``,
    ``handle_impossible_answer``, ``null_score_threshold``.
    """

    def __call__(self, *args, question=None, context=None, **kwargs):
        if question is not None or context is not None:
            if isinstance(question, list):
                contexts = context if isinstance(context, list) else [context] * len(question)
                inputs = [{"question": q, "context": c} for q, c in zip(question, contexts, strict=True)]
            else:
                inputs = {"question": question, "context": context}
        elif len(args) == 2:
            inputs, args = {"question": args[0], "context": args[1]}, ()
        elif len(args) == 1:
            inputs, args = args[0], ()
        else:
            raise ValueError("pass question=... and context=... (or a dict with both, or a list of dicts)")
        return super().__call__(inputs, *args, **kwargs)

    def settings(self, **given) -> dict:
        """The run's settings from config.json, then DEFAULTS, with ``given`` (not None) on top."""
        saved = getattr(self.model.config, "question_answering", None) or {}
        return {**DEFAULTS, **{k: v for k, v in saved.items() if k in DEFAULTS},
                **{k: v for k, v in given.items() if v is not None}}

    def _sanitize_parameters(self, max_seq_len=None, doc_stride=None, max_answer_len=None, n_best=None,
                             handle_impossible_answer=None, null_score_threshold=None, **kwargs):
        preprocess = {k: v for k, v in (("max_seq_len", max_seq_len), ("doc_stride", doc_stride)) if v is not None}
        postprocess = {k: v for k, v in (("max_answer_len", max_answer_len), ("n_best", n_best),
                                         ("handle_impossible_answer", handle_impossible_answer),
                                         ("null_score_threshold", null_score_threshold)) if v is not None}
        return preprocess, {}, postprocess

    def preprocess(self, example, max_seq_len=None, doc_stride=None):
        if not isinstance(example, dict) or not example.get("question") or not example.get("context"):
            raise ValueError(f"a question needs 'question' and 'context' texts, got {example!r}"[:300])
        s = self.settings(max_seq_len=max_seq_len, doc_stride=doc_stride)
        question, context = example["question"].lstrip(), example["context"]
        question_first = self.tokenizer.padding_side == "right"  # XLNet-style models put the context first
        encoded = self.tokenizer(question if question_first else context, context if question_first else question,
                                 truncation="only_second" if question_first else "only_first",
                                 max_length=s["max_seq_len"], stride=s["doc_stride"], return_overflowing_tokens=True,
                                 return_offsets_mapping=True, padding=True, return_tensors="pt")
        side, count = (1 if question_first else 0), len(encoded["input_ids"])
        for i in range(count):
            ids = encoded["input_ids"][i].tolist()
            offsets = np.array([o if s == side else (-1, -1) for o, s in
                                zip(encoded["offset_mapping"][i].tolist(), encoded.sequence_ids(i), strict=True)])
            inputs = {k: encoded[k][i:i + 1] for k in self.tokenizer.model_input_names if k in encoded}
            yield {**inputs, "offsets": offsets, "context": context, "is_last": i == count - 1,
                   "cls_index": ids.index(self.tokenizer.cls_token_id) if self.tokenizer.cls_token_id in ids else 0}

    def _forward(self, model_inputs):
        extra = {k: model_inputs.pop(k) for k in ("offsets", "context", "is_last", "cls_index")}
        output = self.model(**model_inputs)
        return {"start_logits": output.start_logits[0].float(), "end_logits": output.end_logits[0].float(), **extra}

    def postprocess(self, all_outputs, max_answer_len=None, n_best=None, handle_impossible_answer=None,
                    null_score_threshold=None):
        s = self.settings(max_answer_len=max_answer_len, n_best=n_best,
                          handle_impossible_answer=handle_impossible_answer, null_score_threshold=null_score_threshold)
        windows, logits = [], []
        for out in all_outputs:
            start, end = out["start_logits"].numpy(), out["end_logits"].numpy()
            offsets, cls = out["offsets"], out["cls_index"]
            start, end = start[:len(offsets)], end[:len(offsets)]
            context = offsets[:, 0] >= 0
            windows.append(Candidates(top_positions(start, context, s["n_best"]), top_positions(end, context, s["n_best"]),
                                      float(start[cls] + end[cls]), offsets))
            readable = context.copy()
            readable[cls] = True  # the probabilities are over the context and "no answer"
            logits.append((start, end, readable, cls))
        answer = best_answer(windows, all_outputs[0]["context"], s["max_answer_len"],
                             allow_null=bool(s["handle_impossible_answer"]), null_threshold=s["null_score_threshold"])
        if answer.window is None:
            return {"answer": "", "score": 0.0, "start": 0, "end": 0}
        start, end, readable, cls = logits[answer.window]
        i, j = answer.tokens or (cls, cls)
        score = float(_softmax(start, readable)[i] * _softmax(end, readable)[j])
        return {"answer": answer.text, "score": score, "start": answer.start or 0, "end": answer.end or 0}
