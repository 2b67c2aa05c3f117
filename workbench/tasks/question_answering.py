"""Extractive question answering (SQuAD 1.1 and 2.0) with any ``AutoModelForQuestionAnswering``.

Question, context and answers in (a dataset's columns, or SQuAD's own JSON files); a model
that ``pipeline("question-answering", model=...)`` loads out. The rows, their checks, the
context windows and the post-processing live in ``question_answering_data.py``; this module
is the task object around them.

**Evaluation over windows.** The engine's eval loop is the same for every task: it gathers
what ``eval_outputs`` returns per row, here per window: its index, its ``n_best`` best start
and end positions with their logits, and its [CLS] ("no answer") score; fixed-size tensors,
so processes gather them as they gather a classifier's predictions. ``metrics`` then groups
the windows of each question (by the window index: it works in any order and under DDP),
picks the best span over them and scores it with SQuAD's exact match and F1
(``metrics.squad_metrics``, the official scripts' rules).

Data with unanswerable questions (empty answers: SQuAD 2.0) turns on "no answer"
predictions and v2.0 scoring, with ``eval_has_answer_*`` and ``eval_no_answer_*`` beside
the totals.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import torch
import torch.nn.functional as F

from workbench.config import ModelChoice, TrainConfig, window_stride
from workbench.errors import ConfigError, DataError
from workbench.sources.data_checks import SPLITS, require_dataset_dict, split_with_rows
from workbench.sources.data_files import ROW_COLUMN, RowLocator
from workbench.tasks import qa_pipeline
from workbench.tasks import question_answering_data as data
from workbench.tasks.base import (
    FullWeights,
    enable_gradient_checkpointing,
    fingerprint,
    load_pretrained,
    write_predictions,
)
from workbench.tasks.metrics import squad_metrics, squad_scores
from workbench.tasks.token_classification import load_fast_tokenizer

PIPELINE_FILE = "qa_pipeline.py"  # beside the saved model: the pipeline that reads it (qa_pipeline.py)


class QuestionAnsweringTask(FullWeights):
    """Extractive QA: the answer is a span of the context."""

    name = "question_answering"

    def __init__(self, settings: TrainConfig | None = None):
        self.settings = settings or TrainConfig(task="question_answering")
        self.notes: list[tuple[str, str]] = []
        self.examples: dict[str, dict[str, list]] = {}  # per split: questions, contexts, answers, ids
        self.unanswerable: dict[str, int] = {}
        self.data_fingerprint: str | None = None
        self.eval_windows: data.Windows | None = None
        self.predictions: list[dict] = []  # the latest evaluation's answers, for error analysis
        self.window_length = 0  # median train window in tokens: ln of it is a uniform guess's loss
        self.max_length, self.stride = self.settings.max_length, window_stride(self.settings.doc_stride,
                                                                                self.settings.max_length)

    @property
    def version_2(self) -> bool:
        """Whether the data has unanswerable questions (SQuAD 2.0): "no answer" can be predicted."""
        return any(self.unanswerable.values())

    @property
    def columns(self) -> tuple[str, str, str]:
        s = self.settings
        return s.question_column, s.context_column, s.answers_column

    # -- data ---------------------------------------------------------------------
    def check_data(self, splits) -> None:
        require_dataset_dict(splits)
        question, context, answers = self.columns
        for split in SPLITS:
            ds = split_with_rows(splits.get(split), split,
                                 "pass a DatasetDict with 'train' and 'validation' splits, or a folder with "
                                 "train.json and validation.json (SQuAD files: train-v1.1.json, dev-v1.1.json).")
            missing = [c for c in self.columns if c not in ds.column_names]
            if missing:
                shown = ", ".join(c for c in ds.column_names if c != ROW_COLUMN)
                raise DataError(f"The {split} split has no column {missing[0]!r}; its columns: {shown}.",
                                "set question_column, context_column and answers_column to your columns "
                                "(answers: {'text': [...], 'answer_start': [...]} per row).")
            locate = RowLocator(splits, split)
            self.unanswerable[split] = data.check_rows(ds, question, context, answers, split, locate)
            rows = ds.select_columns([question, context, answers]).to_dict()
            self.examples[split] = {"question": rows[question], "context": rows[context], "answers": rows[answers],
                                "id": list(ds["id"]) if "id" in ds.column_names else [str(i) for i in range(len(ds))],
                                "place": locate}
        if self.version_2:
            self.notes.append((f"Unanswerable questions (SQuAD 2.0): {self.unanswerable['train']} in train, "
                               f"{self.unanswerable['validation']} in validation; 'no answer' is predicted when "
                               "its score beats the best span's by more than null_score_threshold="
                               f"{self.settings.null_score_threshold}.", "info"))
        self.data_fingerprint = fingerprint(splits["train"], self.columns)

    def datasets(self, splits, tokenizer, max_length: int, model=None):
        if not self.examples:
            self.check_data(splits)
        s, out = self.settings, []
        # max_length here may be the config's capped to the model's positions: the stride follows it
        self.max_length, self.stride = max_length, window_stride(s.doc_stride, max_length)
        if self.stride >= max_length:
            raise ConfigError("doc_stride", s.doc_stride, f"fewer tokens than max_length ({max_length})",
                              fix="windows overlap by doc_stride tokens and advance by the rest: use about "
                                  "max_length / 3, or leave doc_stride unset.")
        for split in SPLITS:
            rows = self.examples[split]
            too_long = data.question_room(rows["question"], tokenizer, max_length, self.stride)
            if too_long:
                shown = "; ".join(f"{rows['place'](i)}: {n} tokens" for i, n in too_long[:data.SHOWN])
                raise DataError(f"{len(too_long)} {split} question(s) leave no more than doc_stride={self.stride} "
                                f"tokens of context in a {max_length}-token window: {shown}.",
                                "raise max_length, lower doc_stride, or shorten those questions.")
            windows = data.make_windows(rows["question"], rows["context"], rows["answers"], tokenizer, max_length,
                                        self.stride, keep_offsets=split == "validation")
            extra = len(windows) - len(rows["question"])
            if extra:
                self.notes.append((f"{split}: {len(rows['question'])} questions make {len(windows)} windows of at "
                                   f"most {max_length} tokens ({extra} from contexts longer than one window, "
                                   f"overlapping by doc_stride={self.stride}).", "info"))
            out.append(windows)
        lengths = sorted(out[0].lengths)
        self.window_length = lengths[len(lengths) // 2]
        self.eval_windows = out[1]
        return tuple(out)

    def collator(self, tokenizer):
        return data.collator(tokenizer.pad_token_id)

    def rows(self, batch: dict) -> int:
        return len(batch["input_ids"])

    units = rows  # the loss is a mean over windows

    # -- model --------------------------------------------------------------------
    def load_tokenizer(self, choice: ModelChoice):
        return load_fast_tokenizer(choice, "question answering")

    def build_model(self, choice: ModelChoice, tokenizer, config: TrainConfig | None = None):
        from transformers import AutoModelForQuestionAnswering

        from workbench.sources import model_checks

        with model_checks.new_head_notice(2, announce=None, head="span head (answer start and end scores)") as notice:
            model = load_pretrained(AutoModelForQuestionAnswering, choice, dtype=torch.float32)
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        if getattr(config, "gradient_checkpointing", False):
            enable_gradient_checkpointing(model)
        self.notes += [(notice.message, "info")] if notice.message else []
        sample = [f"{q} {c}" for q, c in zip(self.examples["train"]["question"][:32], self.examples["train"]["context"][:32],
                                              strict=True)]
        self.notes += [(w, "warn") for w in model_checks.check_tokenizer(tokenizer, model.config, sample)]
        return model

    # -- training and evaluation --------------------------------------------------
    @staticmethod
    def _inputs(batch: dict) -> dict:
        return {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}

    def loss(self, model, batch: dict) -> torch.Tensor:
        return model(**self._inputs(batch), start_positions=batch["start_positions"],
                     end_positions=batch["end_positions"]).loss

    def eval_outputs(self, model, batch: dict) -> tuple[torch.Tensor, ...]:
        out = model(**self._inputs(batch))
        start, end = out.start_logits.float(), out.end_logits.float()
        loss = (F.cross_entropy(start, batch["start_positions"], reduction="none")
                + F.cross_entropy(end, batch["end_positions"], reduction="none")) / 2
        cls = batch["cls_index"][:, None]
        null = (start.gather(1, cls) + end.gather(1, cls)).squeeze(1)
        mask, k = batch["context_mask"].bool(), self.settings.n_best
        start_at, start_logit = data.top_candidates(start, mask, k)
        end_at, end_logit = data.top_candidates(end, mask, k)
        return loss, batch["feature"], start_at, start_logit, end_at, end_logit, null

    def metrics(self, outputs: list[tuple[torch.Tensor, ...]]) -> dict[str, float]:
        loss, feature, start_at, start_logit, end_at, end_logit, null = (
            torch.cat(parts).cpu() for parts in zip(*outputs, strict=True))
        windows: dict[int, list[data.Candidates]] = {}
        for n, f in enumerate(feature.tolist()):
            candidates = data.Candidates(list(zip(start_at[n].tolist(), start_logit[n].tolist(), strict=True)),
                                         list(zip(end_at[n].tolist(), end_logit[n].tolist(), strict=True)),
                                         float(null[n]), self.eval_windows.offsets[f])
            windows.setdefault(self.eval_windows.example[f], []).append(candidates)
        rows, s = self.examples["validation"], self.settings
        self.predictions = []
        for row in sorted(windows):
            answer = data.best_answer(windows[row], rows["context"][row], s.max_answer_length,
                                      allow_null=self.version_2, null_threshold=s.null_score_threshold)
            references = list(rows["answers"][row]["text"])
            exact, f1 = squad_scores(answer.text, references, version_2=self.version_2)
            self.predictions.append({"id": rows["id"][row], "question": rows["question"][row],
                                     "context": rows["context"][row], "prediction": answer.text, "start": answer.start,
                                     "score": answer.score if math.isfinite(answer.score) else None,
                                     "answers": references, "exact_match": exact, "f1": f1})
        scores = squad_metrics([p["prediction"] for p in self.predictions], [p["answers"] for p in self.predictions],
                               version_2=self.version_2)
        return {"eval_loss": loss.double().mean().item(), **scores}

    def baselines(self, outputs: list[tuple[torch.Tensor, ...]]) -> dict:
        """What a reader that learned nothing scores on these questions (the verdict's bar,
        engine/verdict.py): answering nothing, scored as the SQuAD scripts score it (0 on SQuAD
        1.1 data; the share of unanswerable questions on 2.0 data)."""
        feature = torch.cat([parts[1] for parts in outputs]).tolist()
        rows = sorted({self.eval_windows.example[f] for f in feature})
        references = [list(self.examples["validation"]["answers"][r]["text"]) for r in rows]
        if not rows:
            return {}
        scores = squad_metrics([""] * len(rows), references, version_2=self.version_2)
        return {"rows": len(rows), "baselines": [
            {"name": "answering nothing", "detail": "an empty answer to every question",
             "metrics": {k: scores[k] for k in ("eval_exact_match", "eval_f1")}}]}

    # -- saving ---------------------------------------------------------------------
    def save_model(self, model, tokenizer, directory: Path, state_dict: dict | None = None) -> None:
        """The model, its tokenizer, and the pipeline that reads it (transformers 5 has none of its own):
        ``pipeline("question-answering", model=directory, trust_remote_code=True)``."""
        s = self.settings
        # config.json: the pipeline's file and class, and its defaults (how the run read its windows)
        model.config.custom_pipelines = {"question-answering": {
            "impl": f"{PIPELINE_FILE.removesuffix('.py')}.ExtractiveQuestionAnsweringPipeline",
            "pt": ["AutoModelForQuestionAnswering"], "type": "text"}}
        model.config.question_answering = {
            "max_seq_len": self.max_length, "doc_stride": self.stride, "max_answer_len": s.max_answer_length,
            "n_best": s.n_best, "handle_impossible_answer": self.version_2,
            "null_score_threshold": s.null_score_threshold}
        model.save_pretrained(directory, state_dict=state_dict)
        tokenizer.save_pretrained(directory)
        shutil.copyfile(qa_pipeline.__file__, Path(directory) / PIPELINE_FILE)
        write_predictions(directory, self.predictions)

    def finish(self, model_dir: Path, write_dir) -> list[tuple[str, str]]:
        return [(f"pipeline('question-answering', model={str(model_dir)!r}, trust_remote_code=True) answers a "
                 f"question about a text (the pipeline is {PIPELINE_FILE} in that folder: transformers 5 has none).",
                 "info")]

    def num_classes(self) -> int | None:
        """Positions a start (or end) is chosen among: a uniform guess's loss is ln of the window length."""
        return self.window_length or self.settings.max_length

    def identity(self) -> dict:
        return {"task": self.name, "columns": list(self.columns), "doc_stride": self.stride,
                "data_fingerprint": self.data_fingerprint}
