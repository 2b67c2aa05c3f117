"""Typed configuration: what to train (ModelChoice, DatasetChoice) and how (TrainConfig).

Pickers, parameter files, `workbench train --config` and papermill parameters all
produce these same dataclasses, so a run chosen with the mouse re-runs unchanged
in CI. Validation happens in ``__post_init__`` and names the field that is wrong.

Reading a YAML or JSON parameter file, with the line of each field, is ``config_files.py``'s.
Why ~510 lines: every setting is one field with its check beside it (TrainConfig alone is
~250 lines of fields and checks). The next split: the causal-LM and preference checks
(``_check_causal_lm``, ``_check_preference``, ``_check_spans``) into ``config_checks.py``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from workbench import config_files
from workbench.errors import ConfigError, ConfigFileError

PRECISIONS = ("auto", "fp32", "fp16", "bf16")
SCHEDULERS = ("linear", "cosine", "constant")
# torch.compile modes (engine/compile.py); auto: reduce-overhead on CUDA with bucketed lengths, else default
COMPILE_MODES = ("auto", "default", "reduce-overhead", "max-autotune-no-cudagraphs")
METRICS = ("accuracy", "f1", "loss", "exact_match", "precision", "recall", "reward_accuracy")
DISTRIBUTED = ("ddp", "fsdp")
# auto: the task the data's columns say (engine/inputs.py, resolve_task): question/context/answers
# -> question_answering, tokens + tags -> token_classification, chosen + rejected -> preference,
# chats -> causal_lm, else classification
TASKS = ("auto", "classification", "causal_lm", "token_classification", "question_answering", "preference")
# causal_lm settings (their meaning: workbench.tasks.causal_lm and causal_lm_data)
FINETUNE = ("lora", "qlora", "full")
LOSS_ON = ("completion", "all")
DATA_FORMATS = ("auto", "messages", "prompt_completion", "text")
# token_classification: entity-level (seqeval) precision/recall/F1, word accuracy; question_answering:
# SQuAD exact match and F1 of the post-processed answers
SUBWORD_LABELS = ("first", "all")
TASK_METRICS = {"classification": ("accuracy", "f1", "loss"), "causal_lm": ("loss", "exact_match"),
                "token_classification": ("f1", "precision", "recall", "accuracy", "loss"),
                "question_answering": ("f1", "exact_match", "loss"), "preference": ("reward_accuracy", "loss")}
# The metric that picks the best model when best_metric is None (entity F1 for NER, as seqeval reports it).
DEFAULT_BEST_METRIC = {"classification": "accuracy", "causal_lm": "loss", "token_classification": "f1",
                       "question_answering": "f1", "preference": "reward_accuracy"}
# preference: what is optimized on (prompt, chosen, rejected) rows (workbench.tasks.preference_loss)
PREFERENCE_LOSSES = ("dpo", "ipo", "simpo", "orpo")
# beta when it is not set: DPO's and IPO's 0.1 (TRL's default), SimPO's 2.0 (its paper's range is
# 2.0-2.5), ORPO's weight of the odds-ratio term lambda = 0.1 (its paper's, as in TRL)
DEFAULT_BETA = {"dpo": 0.1, "ipo": 0.1, "simpo": 2.0, "orpo": 0.1}


def window_stride(doc_stride: int | None, max_length: int) -> int:
    """Context tokens two question-answering windows share: ``doc_stride``, or a third of
    ``max_length`` up to 128 (run_qa.py's 128 for 384 tokens)."""
    return doc_stride if doc_stride is not None else max(1, min(128, max_length // 3))


def default_best_metric(task: str | None) -> str:
    """The metric that picks the best model of ``task`` when ``best_metric`` is not set."""
    return DEFAULT_BEST_METRIC.get(task or "classification", "accuracy")


def _check_positive(name: str, value: Any, *, allow_zero: bool = False, kind=int) -> None:
    ok_type = isinstance(value, kind) and not isinstance(value, bool)
    if kind is float:
        ok_type = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok_type or value < 0 or (value == 0 and not allow_zero):
        allowed = f"{'a non-negative' if allow_zero else 'a positive'} {kind.__name__}"
        raise ConfigError(name, value, allowed)


def _check_switch(name: str, value: Any) -> None:
    """A speed-up switch: "auto" (on where it pays), True (forced on), False (the reference path)."""
    if value not in ("auto", True, False) or isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ConfigError(name, value, "auto, true or false")


def _check_jinja(template: str) -> None:
    """Compile a chat template as transformers will, so a syntax error is found before anything loads.

    transformers renders templates in a sandboxed Jinja environment with the loop-control
    extension and its own ``{% generation %}`` block; the same parser is used here.
    """
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):  # transformers' {% generation %} ... {% endgeneration %}
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    try:
        env.parse(template)
    except jinja2.TemplateSyntaxError as exc:
        lines = template.splitlines()
        shown = lines[exc.lineno - 1].strip() if 0 < exc.lineno <= len(lines) else ""
        raise ConfigError("chat_template", f"<template line {exc.lineno}: {shown[:60]}>",
                          "a Jinja template that compiles",
                          fix=f"line {exc.lineno} of the template: {str(exc.message).rstrip('.')}. Close every "
                              "{% if %} / {% for %} with {% endif %} / {% endfor %} and every {{ with }}, "
                              "or use chat_template: simple.") from None


@dataclass
class ModelChoice:
    """Which model to fine-tune: a hub id (``bert-base-uncased``) or a local folder."""

    name_or_path: str = "bert-base-uncased"
    revision: str | None = None  # a hub branch, tag or commit; None = default branch

    def __post_init__(self) -> None:
        if not isinstance(self.name_or_path, str) or not self.name_or_path.strip():
            raise ConfigError("model.name_or_path", self.name_or_path, "a hub id or a local folder")


@dataclass
class DatasetChoice:
    """Which data to train on and which columns hold the text and the label.

    ``source`` is ``"hub"`` (``path`` is a dataset name such as ``stanfordnlp/sst2``)
    or ``"files"`` (``path`` is a CSV/TSV/JSON/JSONL/Parquet file or a folder of them).
    """

    source: str = "hub"
    path: str = "stanfordnlp/sst2"
    config_name: str | None = None
    train_split: str = "train"
    eval_split: str | None = "validation"  # None: split validation_fraction off train
    text_columns: tuple[str, ...] = ("sentence",)
    label_column: str = "label"
    validation_fraction: float = 0.1  # used only when there is no eval split
    max_train_rows: int | None = None  # cap for quick runs; None = all rows
    max_eval_rows: int | None = None
    seed: int = 42  # for the stratified split and row sampling

    def __post_init__(self) -> None:
        if self.source not in ("hub", "files"):
            raise ConfigError("data.source", self.source, "'hub' or 'files'")
        if isinstance(self.text_columns, str):
            self.text_columns = (self.text_columns,)
        self.text_columns = tuple(self.text_columns)
        if not self.text_columns or not all(isinstance(c, str) and c for c in self.text_columns):
            raise ConfigError("data.text_columns", self.text_columns, "one or two column names")
        if len(self.text_columns) > 2:
            raise ConfigError(
                "data.text_columns", self.text_columns, "one column, or two for sentence pairs"
            )
        if not isinstance(self.label_column, str) or not self.label_column:
            raise ConfigError("data.label_column", self.label_column, "a column name")
        if not (isinstance(self.validation_fraction, (int, float)) and 0 < self.validation_fraction < 1):
            raise ConfigError("data.validation_fraction", self.validation_fraction, "a number in (0, 1)")
        for name in ("max_train_rows", "max_eval_rows"):
            value = getattr(self, name)
            if value is not None:
                _check_positive(f"data.{name}", value)


@dataclass
class TrainConfig:
    """How to fine-tune. Defaults follow the BERT paper's fine-tuning recipe.

    ``task`` picks what is trained: ``classification`` (a sequence classifier on text
    and label columns), ``causal_lm`` (a language model on chats, prompt/completion
    pairs or plain text, fully or with LoRA/QLoRA adapters; the fields after
    ``max_skipped_steps`` apply to it only), ``token_classification`` (a tag per word:
    named entities), ``question_answering`` (extractive: a span of the context) or
    ``preference`` (a language model aligned on chosen/rejected answer pairs: DPO, IPO, SimPO,
    ORPO; the causal_lm fields apply to it too); the fields of each are grouped below. ``auto`` (the default) picks one from the data's columns.
    """

    task: str = "auto"  # auto | classification | causal_lm | token_classification | question_answering | preference
    output_dir: str = "outputs/run"  # checkpoints, event log, final model
    learning_rate: float | None = None  # None: 2e-5 (BERT recipe, full fine-tuning), 2e-4 for LoRA/QLoRA
    num_epochs: float = 3.0
    max_steps: int | None = None  # optimizer steps; overrides num_epochs when set
    batch_size: int | str = 16  # per device, per micro-batch; "auto": fill the GPU (engine/batch_size.py), 16 on CPU
    gradient_accumulation_steps: int = 1  # effective batch = batch_size * this * devices
    warmup_ratio: float = 0.06  # share of total steps with a linear warm-up
    scheduler: str = "linear"  # linear | cosine | constant
    weight_decay: float = 0.01
    max_grad_norm: float | None = 1.0  # None disables clipping
    precision: str = "auto"  # auto: bf16 where computed natively (Ampere+ GPUs, AVX512-BF16/AMX CPUs), fp16 on other GPUs, else fp32
    max_length: int = 256  # tokens; longer texts are truncated
    group_by_length: bool = True  # batch similar lengths together: less padding
    eval_every: int | None = None  # optimizer steps; None = at the end of each epoch
    eval_before_training: bool = False  # evaluate at step 0 too: the curves show where the run started
    save_every: int | None = None  # optimizer steps; None = at the end of each epoch
    log_every: int = 10  # optimizer steps between event-log lines
    keep_checkpoints: int = 2  # newest K step checkpoints are kept (plus the best)
    best_metric: str | None = None  # TASK_METRICS[task]; None: accuracy, loss (causal_lm), f1 (NER: entities; QA)
    seed: int = 42
    resume: str | None = "auto"  # "auto": newest valid checkpoint in output_dir; a path; None
    num_workers: int | None = None  # DataLoader workers; None: 2 on CUDA, 0 (main process) on CPU
    gradient_checkpointing: bool = False  # trade compute for activation memory
    distributed: str = "ddp"  # ddp | fsdp (sharded, for models that do not fit one GPU)
    max_skipped_steps: int = 20  # consecutive fp16 overflow skips before giving up
    compile: bool | str = "auto"  # "auto": on CUDA, off on CPU (engine/compile.py says why) | True | False
    compile_mode: str = "auto"  # auto: reduce-overhead (CUDA graphs) on CUDA with bucketed lengths, else default
    async_checkpoints: bool | str = "auto"  # checkpoints written by a thread: "auto" on CUDA, 1 process, no FSDP | True | False

    # task: causal_lm only
    finetune: str = "lora"  # lora | qlora (4-bit base, CUDA only) | full (every weight trains)
    lora_r: int = 16  # adapter rank: trainable parameters grow linearly with it
    lora_alpha: int = 32  # the update is scaled by alpha / r
    lora_dropout: float = 0.05  # on the adapter's input, in [0, 1)
    lora_target_modules: tuple[str, ...] | None = None  # leaf names; None: every linear layer but the head
    loss_on: str = "completion"  # completion: assistant tokens only | all: every token
    chat_template: str | None = None  # None: the tokenizer's own | "simple" | a Jinja template
    data_format: str = "auto"  # auto (from the columns) | messages | prompt_completion | text
    messages_column: str = "messages"  # a list of {role, content} per row
    prompt_column: str = "prompt"
    completion_column: str = "completion"
    text_column: str = "text"  # plain language modelling: every token carries loss
    system_prompt: str | None = None  # a system message put first in each conversation that has none
    eval_generate: int = 0  # eval rows answered greedily for eval_exact_match; 0: off (it is slow)
    eval_max_new_tokens: int = 64
    merge_adapter: bool = False  # also write model_merged/ (base + adapter, a plain model) at the end
    packing: str | bool = "auto"  # auto | True | False: a batch's conversations in one row, no padding (tasks/causal_lm_packing.py)
    fused_loss: bool | str = "auto"  # auto: liger-kernel's fused linear cross-entropy on CUDA when installed | True | False (tasks/causal_lm_loss.py)

    # task: preference only (workbench.tasks.preference; the causal_lm fields above apply too)
    preference_loss: str = "dpo"  # dpo | ipo (against a reference model) | simpo | orpo (reference-free)
    beta: float | None = None  # None: 0.1 (dpo, ipo, orpo's lambda), 2.0 (simpo)
    simpo_gamma: float = 0.5  # simpo's target reward margin
    # The reference's log-probabilities computed once before the first step and kept in the run
    # folder: "auto" for the held-out pairs, and for the train pairs when the run sees them twice
    # (once with full fine-tuning: the frozen copy is then released) | True | False
    precompute_reference: bool | str = "auto"
    chosen_column: str = "chosen"  # the preferred answer (text, or a list of assistant messages)
    rejected_column: str = "rejected"  # the answer that should become less likely

    # task: token_classification only (workbench.tasks.token_classification)
    tokens_column: str | None = None  # a list of words per row; None: "tokens" or "words"
    tags_column: str | None = None  # a tag per word; None: "ner_tags", "tags", "labels" or "ner"
    subword_labels: str = "all"  # all: every sub-word carries its word's tag (B- once) | first: the rest get none

    # task: question_answering only (workbench.tasks.question_answering)
    question_column: str = "question"
    context_column: str = "context"
    answers_column: str = "answers"  # {"text": [...], "answer_start": [...]}; empty lists: unanswerable
    doc_stride: int | None = None  # context tokens two windows share; None: max_length // 3, at most 128
    max_answer_length: int = 30  # tokens: a longer span is never the answer
    n_best: int = 20  # start and end candidates per window that post-processing pairs up
    null_score_threshold: float = 0.0  # unanswerable data: "no answer" when its score beats the best span by more

    def __post_init__(self) -> None:
        if self.learning_rate is not None:
            _check_positive("learning_rate", self.learning_rate, kind=float)
        _check_positive("num_epochs", self.num_epochs, kind=float)
        if self.max_steps is not None:
            _check_positive("max_steps", self.max_steps)
        if self.batch_size != "auto":
            try:
                _check_positive("batch_size", self.batch_size)
            except ConfigError:
                raise ConfigError("batch_size", self.batch_size, "a positive int, or 'auto' (the micro-batch "
                                  "that fills the GPU's memory; 16 on a CPU)") from None
        _check_positive("gradient_accumulation_steps", self.gradient_accumulation_steps)
        if not (isinstance(self.warmup_ratio, (int, float)) and 0 <= self.warmup_ratio < 1):
            raise ConfigError("warmup_ratio", self.warmup_ratio, "a number in [0, 1)")
        if self.scheduler not in SCHEDULERS:
            raise ConfigError("scheduler", self.scheduler, " | ".join(SCHEDULERS))
        _check_positive("weight_decay", self.weight_decay, allow_zero=True, kind=float)
        if self.max_grad_norm is not None:
            _check_positive("max_grad_norm", self.max_grad_norm, kind=float)
        if self.precision not in PRECISIONS:
            raise ConfigError("precision", self.precision, " | ".join(PRECISIONS))
        _check_positive("max_length", self.max_length)
        for name in ("eval_every", "save_every"):
            if getattr(self, name) is not None:
                _check_positive(name, getattr(self, name))
        _check_positive("log_every", self.log_every)
        if not isinstance(self.eval_before_training, bool):
            raise ConfigError("eval_before_training", self.eval_before_training, "true or false")
        _check_positive("keep_checkpoints", self.keep_checkpoints)
        if self.task not in TASKS:
            raise ConfigError("task", self.task, " | ".join(TASKS))
        allowed = TASK_METRICS.get(self.task) or tuple(dict.fromkeys(m for ms in TASK_METRICS.values() for m in ms))
        if self.best_metric is not None and self.best_metric not in allowed:
            raise ConfigError("best_metric", self.best_metric, " | ".join(allowed) + f" (for task {self.task})")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ConfigError("seed", self.seed, "an integer")
        if self.resume is not None and not isinstance(self.resume, str):
            raise ConfigError("resume", self.resume, "'auto', a checkpoint path, or None")
        if self.num_workers is not None:
            _check_positive("num_workers", self.num_workers, allow_zero=True)
        if self.distributed not in DISTRIBUTED:
            raise ConfigError("distributed", self.distributed, " | ".join(DISTRIBUTED))
        _check_positive("max_skipped_steps", self.max_skipped_steps)
        if not (self.compile == "auto" or isinstance(self.compile, bool)):
            raise ConfigError("compile", self.compile, "'auto', true or false")
        if self.compile_mode not in COMPILE_MODES:
            raise ConfigError("compile_mode", self.compile_mode, " | ".join(COMPILE_MODES))
        if not (self.async_checkpoints == "auto" or isinstance(self.async_checkpoints, bool)):
            raise ConfigError("async_checkpoints", self.async_checkpoints, "'auto', true or false")
        self._check_causal_lm()
        self._check_preference()
        self._check_spans()

    def _check_preference(self) -> None:
        if self.preference_loss not in PREFERENCE_LOSSES:
            raise ConfigError("preference_loss", self.preference_loss, " | ".join(PREFERENCE_LOSSES))
        if self.beta is not None:
            _check_positive("beta", self.beta, kind=float)
        if not (self.precompute_reference == "auto" or isinstance(self.precompute_reference, bool)):
            raise ConfigError("precompute_reference", self.precompute_reference, "'auto', true or false")
        if isinstance(self.simpo_gamma, bool) or not isinstance(self.simpo_gamma, (int, float)) \
                or not math.isfinite(self.simpo_gamma) or self.simpo_gamma < 0:
            raise ConfigError("simpo_gamma", self.simpo_gamma, "a number >= 0 (0.5: SimPO's usual margin)")
        for name in ("chosen_column", "rejected_column"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ConfigError(name, getattr(self, name), "a column name")
        if self.task == "preference" and self.eval_generate:
            raise ConfigError("eval_generate", self.eval_generate, "0 for task preference",
                              fix="set eval_generate: 0: a preference run is judged by its held-out reward "
                                  "accuracy (eval_reward_accuracy), not by exact match with one reference answer.")

    @property
    def lr(self) -> float:
        """``learning_rate``, or the task's default: adapters start from zero and need ~10x the
        rate that full fine-tuning uses (2e-4 vs 2e-5, as in the LoRA and QLoRA papers' recipes)."""
        if self.learning_rate is not None:
            return self.learning_rate
        if self.task == "preference":  # pushing an already good model apart from its reference: gentler
            return 5e-5 if self.finetune != "full" else 1e-6  # TRL's DPO default for full fine-tuning
        return 2e-4 if self.task == "causal_lm" and self.finetune != "full" else 2e-5

    @property
    def preference_beta(self) -> float:
        """``beta``, or the preference loss's usual value (``DEFAULT_BETA``)."""
        return float(self.beta) if self.beta is not None else DEFAULT_BETA[self.preference_loss]

    @property
    def selection_metric(self) -> str:
        """The eval metric that picks the best model: ``best_metric``, or the task's default."""
        return self.best_metric or default_best_metric(self.task)

    @property
    def window_stride(self) -> int:
        """``doc_stride``, or for None run_qa.py's 128 of 384: a third of max_length, at most 128."""
        return window_stride(self.doc_stride, self.max_length)

    def _check_spans(self) -> None:
        """The token_classification and question_answering fields."""
        for name in ("tokens_column", "tags_column"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(name, value, "a column name, or None to find it")
        if self.subword_labels not in SUBWORD_LABELS:
            raise ConfigError("subword_labels", self.subword_labels, " | ".join(SUBWORD_LABELS))
        for name in ("question_column", "context_column", "answers_column"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ConfigError(name, getattr(self, name), "a column name")
        for name in ("max_answer_length", "n_best"):
            _check_positive(name, getattr(self, name))
        if self.doc_stride is not None:
            _check_positive("doc_stride", self.doc_stride)
        if self.task == "question_answering" and self.window_stride >= self.max_length:
            raise ConfigError("doc_stride", self.doc_stride, f"fewer tokens than max_length ({self.max_length})",
                              fix="windows overlap by doc_stride tokens and advance by the rest: use about "
                                  "max_length / 3 (128 for max_length 384).")
        if isinstance(self.null_score_threshold, bool) or not isinstance(self.null_score_threshold, (int, float)):
            raise ConfigError("null_score_threshold", self.null_score_threshold, "a number (0.0: no bias)")

    def _check_causal_lm(self) -> None:
        if self.finetune not in FINETUNE:
            raise ConfigError("finetune", self.finetune, " | ".join(FINETUNE))
        for name in ("lora_r", "lora_alpha", "eval_max_new_tokens"):
            _check_positive(name, getattr(self, name))
        _check_positive("eval_generate", self.eval_generate, allow_zero=True)
        if self.task == "causal_lm" and self.best_metric == "exact_match" and not self.eval_generate:
            raise ConfigError("best_metric", self.best_metric, "loss, or exact_match with eval_generate > 0",
                              fix="set eval_generate to the number of eval rows to answer, or "
                                  "best_metric='loss'.")
        if not (isinstance(self.lora_dropout, (int, float)) and not isinstance(self.lora_dropout, bool)
                and 0 <= self.lora_dropout < 1):
            raise ConfigError("lora_dropout", self.lora_dropout, "a number in [0, 1)")
        if isinstance(self.lora_target_modules, str):
            self.lora_target_modules = (self.lora_target_modules,)
        if self.lora_target_modules is not None:
            self.lora_target_modules = tuple(self.lora_target_modules)
            if not self.lora_target_modules or not all(
                    isinstance(t, str) and t for t in self.lora_target_modules):
                raise ConfigError("lora_target_modules", self.lora_target_modules,
                                  "None (every linear layer but the head) or layer names like [q_proj, v_proj]")
        if self.loss_on not in LOSS_ON:
            raise ConfigError("loss_on", self.loss_on, " | ".join(LOSS_ON))
        if self.chat_template is not None and (
                not isinstance(self.chat_template, str) or
                (self.chat_template != "simple" and "{{" not in self.chat_template)):
            raise ConfigError("chat_template", self.chat_template,
                              "None (the tokenizer's own), 'simple', or a Jinja template with {{ ... }}")
        if self.chat_template not in (None, "simple"):
            _check_jinja(self.chat_template)
        if self.data_format not in DATA_FORMATS:
            raise ConfigError("data_format", self.data_format, " | ".join(DATA_FORMATS))
        for name in ("messages_column", "prompt_column", "completion_column", "text_column"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ConfigError(name, getattr(self, name), "a column name")
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            raise ConfigError("system_prompt", self.system_prompt, "text, or None")
        if not isinstance(self.merge_adapter, bool):
            raise ConfigError("merge_adapter", self.merge_adapter, "true or false")
        for name in ("packing", "fused_loss"):
            _check_switch(name, getattr(self, name))
            if getattr(self, name) is True and self.task not in ("auto", "causal_lm"):
                raise ConfigError(name, True, f"'auto' or False for task {self.task!r}",
                                  fix=f"remove {name}: it applies to causal language models (task: causal_lm) only.")


_EXAMPLE = {  # what a section looks like, for the messages below
    "model": "model:\n  name_or_path: bert-base-uncased",
    "data": "data:\n  source: files\n  path: data/train.csv\n  text_columns: [text]",
    "train": "train:\n  num_epochs: 2\n  batch_size: 16",
}


def _build(cls, values: dict[str, Any] | None, section: str):
    if values is not None and not isinstance(values, Mapping):
        raise ConfigError(section, values, f"a mapping of field: value pairs, e.g.\n{_EXAMPLE[section]}",
                          fix=f"write the {section} section's fields as 'field: value' lines indented"
                          f" under '{section}:' (not a list or a single value).")
    values = dict(values or {})
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f"did you mean {section}.{close[0]}? " if close else ""
        raise ConfigError(f"{section}.{unknown[0]}", values[unknown[0]], "one of: " + ", ".join(sorted(known)),
                          fix=f"{hint}use one of the {section} fields listed.")
    return cls(**values)


@dataclass
class RunSpec:
    """A whole headless run: the parameter file of `workbench train` and of papermill."""

    model: ModelChoice = field(default_factory=ModelChoice)
    data: DatasetChoice = field(default_factory=DatasetChoice)
    train: TrainConfig = field(default_factory=TrainConfig)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunSpec:
        if not isinstance(values, Mapping):
            raise ConfigError("config", values, "a mapping with the sections model, data, train",
                              fix="start from the file the pickers export (picker.export('run.yaml')).")
        unknown = sorted(set(values) - set(config_files.SECTIONS))
        if unknown:
            raise ConfigError(unknown[0], values[unknown[0]], "sections model, data, train")
        return cls(
            model=_build(ModelChoice, values.get("model"), "model"),
            data=_build(DatasetChoice, values.get("data"), "data"),
            train=_build(TrainConfig, values.get("train"), "train"),
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> RunSpec:
        """Read a YAML (.yaml/.yml) or JSON file.

        Every problem is a ConfigFileError (a ConfigError) with the file and, where the
        parser or the file's layout tells it, the line: a syntax error says what the
        parser expected there, a wrong value or field names the line that sets it.
        """
        path = Path(path)
        if not path.is_file():
            raise ConfigError("config", str(path), "an existing .yaml, .yml or .json file",
                              fix=f"check the path (relative paths start at {Path.cwd()}); `workbench train "
                                  "--config run.yaml` reads a file the pickers export (picker.export('run.yaml')).")
        text = path.read_text(encoding="utf-8")
        values, lines = config_files.parse(path, text)
        try:
            return cls.from_dict(values)
        except ConfigFileError:
            raise
        except ConfigError as e:
            line = config_files.line_of(lines, e.field)
            fix = e.fix or (f"edit {'line ' + str(line) + ' of ' if line else ''}{path.name}: "
                            f"{e.field} must be {e.allowed}.")
            raise ConfigFileError(path, line, e.message, fix, field=e.field, value=e.value,
                                  allowed=e.allowed) from None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["data"]["text_columns"] = list(self.data.text_columns)
        if self.train.lora_target_modules is not None:  # YAML safe_dump writes no tuples
            out["train"]["lora_target_modules"] = list(self.train.lora_target_modules)
        return out

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix in (".yaml", ".yml"):
            import yaml

            path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False), encoding="utf-8")
        else:
            path.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        return path
