"""Model and dataset pickers: choose with the mouse, export a parameter file for headless runs.

The widgets only arrange controls; the work is done by workbench.sources (models,
vram, data, data_checks), the same functions papermill runs and ``workbench train`` use. Every
action catches errors and writes them to the picker's ``message`` (an HTML widget),
so a notebook never shows a traceback for a wrong path or column.

    from workbench import pickers
    p = pickers()            # display it, choose, then:
    spec = p.run_spec()      # RunSpec(model, data, train) for fit() or RunSpec.save()

Causal LMs: the model picker shows decoder facts and full / LoRA / QLoRA memory, the
dataset picker recognises chat and prompt/completion data and previews the tokens
that carry loss; those views live in workbench.widgets.causal_views. Token classification
and question answering: the dataset picker recognises words + tags and question + context +
answers and shows the entities or the answers in context (workbench.widgets.span_views).
The HTML pieces are in workbench.widgets.html_blocks. Here: the controls, the events and the export.

Without a GPU the model picker also estimates the time per epoch on this CPU, in the
precision "auto" picks here (``workbench.sources.cpu_time``), from the dataset picker's rows.

Why ~690 lines: two pickers and the combined one, each one class, share the export. The next
split: DatasetPicker (with its task views) into a module of its own, the export beside it.
"""

from __future__ import annotations

import html
import shlex
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import traitlets

from workbench.config import PRECISIONS, DatasetChoice, ModelChoice, RunSpec, TrainConfig
from workbench.errors import DataError, WorkbenchError
from workbench.sources import cpu_time, data, data_checks, models, vram
from workbench.widgets.causal_views import (
    ChatDataView,
    causal_estimate_html,
    causal_model_html,
    find_chat_columns,
)
from workbench.widgets.html_blocks import WARNING, error_html, note_html, table_html
from workbench.widgets.label_chart import label_chart_png
from workbench.widgets.span_views import SpanDataView

NOTEBOOK = "notebooks/01_quickstart.ipynb"  # the notebook the papermill line runs
TASK_OPTIONS = [("Classification", "classification"), ("Causal LM", "causal_lm"),
                ("Token classification", "token_classification"), ("Question answering", "question_answering")]
SPAN_TASKS = ("token_classification", "question_answering")  # their data view: span_views.SpanDataView


# ---------------------------------------------------------------- model picker


class ModelPicker(widgets.VBox):
    """Pick a discovered model or type a hub id / folder; see its config and memory estimate.

    State (traitlets): ``name_or_path``, ``precision``, ``batch_size``, ``seq_len``,
    ``gradient_checkpointing``, ``task`` (classification | causal_lm: set from the chosen
    model, changeable) and ``finetune`` (full | lora | qlora, causal LMs). ``info`` is the
    selected ModelInfo (None until one loads); ``fit`` the latest vram.FitCheck
    (classification), ``causal_fit`` the latest vram.CausalFitCheck and ``facts`` the
    models.CausalFacts (causal LM). Without a GPU, ``cpu_time`` is the time estimate on this
    CPU, for ``train_rows`` rows of ``text_chars`` characters (0: unknown; ``Pickers`` links
    them to the dataset picker).
    """

    name_or_path = traitlets.Unicode("")
    task = traitlets.Unicode("classification")
    finetune = traitlets.Unicode("lora")
    precision = traitlets.Unicode("auto")
    batch_size = traitlets.Int(16)
    seq_len = traitlets.Int(256)
    gradient_checkpointing = traitlets.Bool(False)
    train_rows = traitlets.Int(0)  # rows per epoch, for the CPU time estimate (0: unknown)
    text_chars = traitlets.Float(0.0)  # mean characters of a row's text (0: unknown, count max_length)

    def __init__(self, *, device_index: int = 0, nvml: Any = None, free_bytes: int | None = None,
                 **kwargs: Any):
        self._device_index = device_index
        self._nvml = nvml
        self._free_bytes = free_bytes  # fixed free memory (tests, what-if); None: ask the GPU
        self._selecting = False  # True while a new model sets task and length
        self.info: models.ModelInfo | None = None
        self.fit: vram.FitCheck | None = None
        self.causal_fit: vram.CausalFitCheck | None = None
        self.facts: models.CausalFacts | None = None
        self.cpu_time: cpu_time.CpuTimeEstimate | None = None
        self.entries = models.list_models()
        self.found = widgets.Dropdown(
            options=[("(choose a model)", "")] + [(f"{e.name}  [{e.source}]", e.name_or_path)
                                                  for e in self.entries],
            description="Found", layout=widgets.Layout(width="70%"))
        self.typed = widgets.Text(placeholder="hub id (bert-base-uncased) or a folder path",
                                  description="Or type", continuous_update=False,
                                  layout=widgets.Layout(width="70%"))
        self.precision_box = widgets.Dropdown(options=list(PRECISIONS), value="auto",
                                              description="Precision")
        self.batch_box = widgets.BoundedIntText(value=16, min=1, max=4096, description="Batch")
        self.seq_box = widgets.BoundedIntText(value=256, min=8, max=131072, description="Max length")
        self.checkpointing_box = widgets.Checkbox(value=False, description="Gradient checkpointing")
        self.task_box = widgets.ToggleButtons(options=TASK_OPTIONS, value="classification")
        self.finetune_box = widgets.Dropdown(options=[("LoRA", "lora"), ("QLoRA (4-bit base)", "qlora"),
                                                      ("Full", "full")], value="lora", description="Fine-tune")
        self.finetune_box.layout.display = "none"  # causal LMs only
        self.details = widgets.HTML()
        self.estimate = widgets.HTML()
        self.message = widgets.HTML()
        super().__init__([
            widgets.HTML("<b>Model</b>"), self.found, self.typed, self.task_box,
            widgets.HBox([self.precision_box, self.batch_box, self.seq_box]),
            widgets.HBox([self.checkpointing_box, self.finetune_box]), self.details, self.estimate, self.message,
        ], **kwargs)
        # widget -> trait, both ways, so code and mouse can set either
        widgets.link((self.precision_box, "value"), (self, "precision"))
        widgets.link((self.batch_box, "value"), (self, "batch_size"))
        widgets.link((self.seq_box, "value"), (self, "seq_len"))
        widgets.link((self.checkpointing_box, "value"), (self, "gradient_checkpointing"))
        widgets.link((self.task_box, "value"), (self, "task"))
        widgets.link((self.finetune_box, "value"), (self, "finetune"))
        self.found.observe(self._on_found, "value")
        self.typed.observe(self._on_typed, "value")
        self.observe(self._on_settings, ["precision", "batch_size", "seq_len",
                                         "gradient_checkpointing", "finetune", "train_rows", "text_chars"])
        self.observe(self._on_task, "task")
        self.observe(self._on_name, "name_or_path")
        if not self.entries:
            self.message.value = note_html(
                "No local models found (models folder, installed packages, Hugging Face cache). "
                "Type a hub id, or set WORKBENCH_MODELS to a folder of saved models.", WARNING)

    # -- public

    def select(self, name_or_path: str) -> models.ModelInfo | None:
        """Select a model by id or path (what the dropdown and text box do)."""
        self.name_or_path = str(name_or_path)
        return self.info

    @property
    def model_choice(self) -> ModelChoice:
        if not self.name_or_path:
            raise WorkbenchError("no model is selected.", "choose one in the list or type a hub id.")
        return ModelChoice(name_or_path=self.name_or_path)

    # -- events

    def _on_found(self, change) -> None:
        if change["new"]:
            self.name_or_path = change["new"]

    def _on_typed(self, change) -> None:
        if change["new"].strip():
            self.name_or_path = change["new"].strip()

    def _on_name(self, change) -> None:
        self.info, self.fit, self.causal_fit, self.facts = None, None, None, None
        self.details.value = self.estimate.value = self.message.value = ""
        self._show_name(change["new"])
        if not change["new"]:
            return
        try:
            self.info = models.model_info(change["new"])
            if models.is_causal_lm(self.info):
                from transformers import AutoConfig

                self.facts = models.causal_facts(AutoConfig.for_model(**self.info.config), change["new"])
        except Exception as e:  # every failure lands in the message area
            self.info, self.facts = None, None
            self.message.value = error_html(e)
            return
        info = self.info
        self._selecting = True  # the task and length observers wait: one estimate below, not three
        try:
            # A decoder trains as a causal LM; an encoder keeps the task the data chose (NER, QA...).
            self.task = "causal_lm" if self.facts else ("classification" if self.task == "causal_lm" else self.task)
            if info.max_position_embeddings and self.seq_len > info.max_position_embeddings:
                self.seq_len = info.max_position_embeddings
        finally:
            self._selecting = False
        self._show_task()

    def _on_task(self, change) -> None:
        self.finetune_box.layout.display = None if change["new"] == "causal_lm" else "none"
        if self.info is not None and not self._selecting:
            self._show_task()

    def _show_task(self) -> None:
        """Details, notes and estimate of the selected model for the chosen task."""
        info = self.info
        self.finetune_box.layout.display = None if self.task == "causal_lm" else "none"
        self.message.value = ""
        if self.task == "causal_lm" and self.facts is not None:
            self.details.value = causal_model_html(info, self.facts)
        else:
            self.details.value = note_html(info.summary() + f"\nParameters: {info.parameter_method}.")
        if self.task == "causal_lm" and self.facts is None:
            self.message.value = note_html(
                f"{info.architecture} ({info.model_type}) is not a causal language model; choose a decoder "
                "such as Llama, Qwen or SmolLM, or switch the task to classification.", WARNING)
        elif self.task == "classification" and not info.supports_sequence_classification:
            self.message.value = note_html(
                f"{info.model_type} has no sequence-classification head in transformers; choose an "
                "encoder such as BERT, RoBERTa or DeBERTa for text classification.", WARNING)
        self._update_estimate()

    def _show_name(self, name: str) -> None:
        """Show the selection in the list or the text box, whichever holds it, so a model
        chosen from code (``select``) is visible too; the other one is cleared."""
        listed = name in [value for _, value in self.found.options]
        # Same value as the trait: the observers above set nothing new, so no loop.
        self.found.value = name if listed else ""
        self.typed.value = "" if listed or not name else name

    def _on_settings(self, change) -> None:
        if self.info is not None and not self._selecting:
            self._update_estimate()

    def _update_estimate(self) -> None:
        if self.task == "causal_lm":
            self._update_causal_estimate()
            return
        self.causal_fit = None
        try:
            self.fit = vram.check_fit(
                self.info, batch_size=self.batch_size, seq_len=self.seq_len,
                precision=self.precision, gradient_checkpointing=self.gradient_checkpointing,
                free_bytes=self._free_bytes, gpu_name="the GPU" if self._free_bytes else None,
                device_index=self._device_index, nvml=self._nvml)
        except Exception as e:
            self.fit = None
            self.estimate.value = error_html(e)
            return
        color = {True: "#1b5e20", False: "#b00020", None: "#333"}[self.fit.fits]
        self.estimate.value = note_html(self.fit.message, color) + self._cpu_time_html(self.fit.free_bytes)

    def _update_causal_estimate(self) -> None:
        self.fit, self.causal_fit = None, None
        if self.facts is None:  # not a decoder: the message says so
            self.estimate.value = ""
            return
        try:
            self.causal_fit = vram.check_causal_fit(
                self.info, batch_size=self.batch_size, seq_len=self.seq_len, precision=self.precision,
                free_bytes=self._free_bytes, gpu_name="the GPU" if self._free_bytes else None,
                device_index=self._device_index, nvml=self._nvml)
        except Exception as e:
            self.estimate.value = error_html(e)
            return
        self.estimate.value = (causal_estimate_html(self.causal_fit, self.finetune, self.gradient_checkpointing)
                               + self._cpu_time_html(self.causal_fit.free_bytes))

    def _cpu_time_html(self, gpu_free_bytes: int | None) -> str:
        """Without a GPU to train on: the time per epoch on this CPU, in the precision a run would use."""
        self.cpu_time = None
        if gpu_free_bytes is not None:
            return ""
        try:
            self.cpu_time = cpu_time.estimate_cpu_time(
                self.info, seq_len=self.seq_len, precision=self.precision, rows=self.train_rows or None,
                row_tokens=cpu_time.tokens_from_chars(self.text_chars, self.seq_len),
                finetune=self.finetune if self.task == "causal_lm" else "full")
        except Exception as e:  # fp16 on a CPU: the run would refuse it too
            return error_html(e)
        return note_html(self.cpu_time.describe())


def model_picker(**kwargs: Any) -> ModelPicker:
    """A ModelPicker; display it in a notebook. ``.model_choice`` gives the ModelChoice."""
    return ModelPicker(**kwargs)


# ---------------------------------------------------------------- dataset picker


class DatasetPicker(widgets.VBox):
    """Pick a hub dataset or local files, preview them, choose columns, see the labels.

    State (traitlets): ``source``, ``path``, ``config_name``, ``train_split``,
    ``eval_split``, ``text_columns``, ``label_column``, ``validation_fraction``, ``seed``.
    ``load()`` reads the source; ``check()`` runs data.load_choice exactly as a run will.

    Causal LM (``task="causal_lm"``, set by ``load()`` when the data holds chats or
    prompt/completion pairs): no label column; ``chat`` (a ChatDataView) picks the
    format and columns and shows the first example through the tokenizer of
    ``model_name`` with the tokens that carry loss highlighted, cut at ``max_length``.
    """

    source = traitlets.Unicode("files")
    path = traitlets.Unicode("")
    config_name = traitlets.Unicode("")
    train_split = traitlets.Unicode("train")
    eval_split = traitlets.Unicode("")  # "" = none: split off train
    text_columns = traitlets.Tuple()
    label_column = traitlets.Unicode("")
    validation_fraction = traitlets.Float(0.1)
    seed = traitlets.Int(42)
    task = traitlets.Unicode("classification")
    model_name = traitlets.Unicode("")  # whose chat template renders the causal-LM preview
    max_length = traitlets.Int(256)  # tokens kept per row (the model picker's max length)
    train_rows = traitlets.Int(0)  # rows one epoch trains on (after check(): exact; 0 before load)
    text_chars = traitlets.Float(0.0)  # mean characters of the text columns (classification; 0: unknown)

    def __init__(self, preview_rows: int = 5, **kwargs: Any):
        self._preview_rows = preview_rows
        self.raw = None  # DatasetDict as loaded, all splits
        self.checked = None  # DatasetDict from load_choice
        self.source_box = widgets.ToggleButtons(options=[("Local files", "files"), ("Hub", "hub")],
                                                value="files")
        self.path_box = widgets.Text(placeholder="data/train.csv, a folder, or stanfordnlp/sst2",
                                     description="Path / name", continuous_update=False,
                                     layout=widgets.Layout(width="70%"))
        self.config_box = widgets.Text(description="Config", placeholder="(hub only, optional)")
        self.load_button = widgets.Button(description="Load", button_style="primary")
        self.splits_info = widgets.HTML()
        self.preview = widgets.HTML()
        self.train_box = widgets.Dropdown(description="Train split", options=["train"])
        self.eval_box = widgets.Dropdown(description="Eval split", options=[("(split off train)", "")])
        self.text_box = widgets.SelectMultiple(description="Text column(s)", rows=4)
        self.label_box = widgets.Dropdown(description="Label column")
        self.fraction_box = widgets.BoundedFloatText(value=0.1, min=0.01, max=0.5, step=0.01,
                                                     description="Validation share")
        self.seed_box = widgets.IntText(value=42, description="Seed")
        self.check_button = widgets.Button(description="Check labels")
        self.distribution = widgets.HTML()
        self.chart = widgets.Image(format="png", layout=widgets.Layout(max_width="480px"))
        # An Image with no bytes renders as a broken-image icon: show it only with a chart.
        self.chart.layout.display = "none"
        self.chart.observe(
            lambda change: setattr(self.chart.layout, "display", None if change["new"] else "none"),
            "value")
        self.message = widgets.HTML()
        self.task_box = widgets.ToggleButtons(options=TASK_OPTIONS, value="classification")
        self.chat = ChatDataView()
        self.chat.layout.display = "none"
        self.spans = SpanDataView()  # token classification and question answering
        self.spans.layout.display = "none"
        self.label_columns = widgets.HBox([self.text_box, self.label_box])  # classification only
        for box in (self.path_box, self.config_box, self.train_box, self.eval_box, self.text_box,
                    self.label_box, self.fraction_box, self.seed_box):
            box.style.description_width = "110px"  # the default 90px cuts "Text column(s)"
        super().__init__([
            widgets.HTML("<b>Dataset</b>"), self.task_box, self.source_box, self.path_box, self.config_box,
            self.load_button, self.splits_info, self.preview,
            widgets.HBox([self.train_box, self.eval_box]),
            self.label_columns, self.chat, self.spans,
            widgets.HBox([self.fraction_box, self.seed_box]),
            self.check_button, self.distribution, self.chart, self.message,
        ], **kwargs)
        for box, trait in [(self.source_box, "source"), (self.path_box, "path"),
                           (self.config_box, "config_name"), (self.fraction_box, "validation_fraction"),
                           (self.seed_box, "seed")]:
            widgets.link((box, "value"), (self, trait))
        self.load_button.on_click(lambda _: self.load())
        self.check_button.on_click(lambda _: self.check())
        self.train_box.observe(lambda c: self._set("train_split", c["new"]), "value")
        self.eval_box.observe(lambda c: self._set("eval_split", c["new"]), "value")
        self.text_box.observe(lambda c: self._set("text_columns", tuple(c["new"])), "value")
        self.label_box.observe(lambda c: self._set("label_column", c["new"] or ""), "value")
        self.observe(self._on_columns, ["text_columns", "label_column", "train_split", "eval_split"])
        self.observe(lambda _: self._update_size(), ["text_columns", "train_split", "eval_split",
                                                     "validation_fraction", "task"])
        widgets.link((self.task_box, "value"), (self, "task"))
        self.observe(self._on_task, "task")
        self.observe(lambda _: self._show_chat(), ["model_name", "max_length"])

    def _set(self, trait: str, value: Any) -> None:
        if value is not None:
            setattr(self, trait, value)

    # -- public

    def load(self) -> bool:
        """Read the source, fill the preview and the choosers. False (and a message) on error."""
        self.message.value = self.distribution.value = ""
        self.checked = None
        try:
            if not self.path.strip():
                raise WorkbenchError("no dataset given.",
                                     "type a file or folder path, or a hub dataset name.")
            self.raw = data.load_raw(DatasetChoice(
                source=self.source, path=self.path.strip(), config_name=self.config_name or None,
                text_columns=("text",), label_column="label"))
        except Exception as e:
            self.raw = None
            self.preview.value = self.splits_info.value = ""
            self.message.value = error_html(e)
            return False
        splits = list(self.raw)
        self.splits_info.value = note_html(
            "Rows per split: " + ", ".join(f"{s} {self.raw[s].num_rows:,}" for s in splits))
        train = "train" if "train" in splits else splits[0]
        evals = [s for s in splits if s != train]
        eval_default = next((s for s in ("validation", "valid", "dev") if s in evals), "")
        columns = list(self.raw[train].column_names)
        text_guess, label_guess = data_checks.suggest_columns(columns)
        with self.hold_trait_notifications():
            self.train_box.options = splits
            self.train_box.value = train
            self.eval_box.options = [("(split off train)", "")] + [(s, s) for s in evals]
            self.eval_box.value = eval_default
            self.text_box.options = columns
            self.label_box.options = [("(choose)", None)] + [(c, c) for c in columns]
            self.text_box.value = tuple(text_guess)
            self.label_box.value = label_guess
        self.train_split, self.eval_split = train, eval_default
        self.text_columns, self.label_column = tuple(text_guess), label_guess or ""
        ds = self.raw[train]
        self.preview.value = table_html(data_checks.preview_rows(ds, self._preview_rows), columns,
                                        data_checks.column_types(ds))
        self.fraction_box.disabled = bool(eval_default)
        self._update_size()
        self.chat.set_rows(ds)
        self.spans.set_rows(ds)
        detected = data_checks.detect_task(ds)
        if find_chat_columns(ds):
            self.task = "causal_lm"  # chats and prompt/completion pairs have no label to ask for
        elif detected in SPAN_TASKS:
            self.task = detected  # words + tags, or question + context + answers
        elif self.task in SPAN_TASKS:
            self.task = "classification"
        self._show_chat()
        if self.task == "classification" and (not text_guess or not label_guess):
            self.message.value = note_html(
                "Choose the text column(s) and the label column: the names do not say which they are.",
                WARNING)
        return True

    def check(self) -> bool:
        """Load the current choice exactly as a run will (data.load_choice; for a causal LM the
        splits and the task's row check); show rows per split and the label counts."""
        self.message.value = ""
        causal, spans = self.task == "causal_lm", self.task in SPAN_TASKS
        try:
            choice = self.dataset_choice
            self.checked = (self.chat.check(choice) if causal else self.spans.check(choice) if spans
                            else data.load_choice(choice))
        except Exception as e:
            self.checked = None
            self.message.value = error_html(e)
            return False
        note = "" if choice.eval_split else (f" (validation: a {'random' if causal else 'stratified'} "
                                             f"{choice.validation_fraction:.0%} of train, seed {choice.seed})")
        rows = "Rows: " + ", ".join(f"{s} {self.checked[s].num_rows:,}" for s in self.checked) + note
        self._update_size()
        if causal or spans:
            kind = self.chat.data_format if causal else self.task.replace("_", " ")
            self.distribution.value = note_html(rows + f"\nEvery row is a valid {kind} example.")
            return True
        counts = data_checks.label_distribution(self.checked, choice.label_column)
        self.distribution.value = note_html(
            rows + "\nLabels: " + "; ".join(f"{s}: " + ", ".join(f"{k} {v}" for k, v in c.items())
                                             for s, c in counts.items()))
        self.chart.value = label_chart_png(counts)
        return True

    def select_columns(self, text_columns: str | tuple[str, ...] | list[str], label_column: str) -> None:
        """Choose the text and label columns from code (a notebook's parameters), widgets included.

        After ``load()``, a column that is not in the data raises DataError naming it and
        listing the columns there are (also shown in the message area), before any widget
        is touched: the widgets themselves would only say ipywidgets' "TraitError: Invalid
        selection: value not found". Before ``load()`` (or when it failed) only the choice
        is stored; ``check()`` and the run report a wrong column then.
        """
        text_columns = (text_columns,) if isinstance(text_columns, str) else tuple(text_columns)
        if self.raw is not None:
            split = self.train_split if self.train_split in self.raw else next(iter(self.raw))
            available = list(self.raw[split].column_names)
            missing = [c for c in dict.fromkeys((*text_columns, label_column)) if c not in available]
            if missing:
                names = ", ".join(repr(c) for c in missing)
                error = DataError(
                    f"{'column' if len(missing) == 1 else 'columns'} {names} "
                    f"{'is' if len(missing) == 1 else 'are'} not in {self.path.strip()} (split {split!r});"
                    f" its columns are: {', '.join(available)}.",
                    "set text_column / label_column (the parameters cell) to columns from that list and"
                    " run the cells again, or choose them in the picker.")
                self.message.value = error_html(error)
                raise error
            with self.hold_trait_notifications():
                self.text_box.value = text_columns
                self.label_box.value = label_column
        self.text_columns, self.label_column = text_columns, label_column

    @property
    def dataset_choice(self) -> DatasetChoice:
        if not self.path.strip():
            raise WorkbenchError("no dataset given.", "type a file or folder path, or a hub name.")
        if self.task == "causal_lm" or self.task in SPAN_TASKS:
            # These runs read the columns named in their train section (train_fields) and ignore
            # these two; text_columns records (the first two of) those columns for the reader.
            columns = self.chat.columns if self.task == "causal_lm" else self.spans.columns[:2]
            return DatasetChoice(
                source=self.source, path=self.path.strip(), config_name=self.config_name or None,
                train_split=self.train_split or "train", eval_split=self.eval_split or None,
                text_columns=columns or ("text",), validation_fraction=self.validation_fraction,
                seed=self.seed)
        if not self.text_columns or not self.label_column:
            raise WorkbenchError("the text and label columns are not chosen.",
                                 "pick one or two text columns and a label column (after Load).")
        return DatasetChoice(
            source=self.source, path=self.path.strip(), config_name=self.config_name or None,
            train_split=self.train_split or "train", eval_split=self.eval_split or None,
            text_columns=tuple(self.text_columns), label_column=self.label_column,
            validation_fraction=self.validation_fraction, seed=self.seed)

    @property
    def train_fields(self) -> dict[str, str]:
        """TrainConfig fields of this data choice: the causal-LM format and columns; {} for classification."""
        if self.task in SPAN_TASKS:
            return self.spans.train_fields
        return self.chat.train_fields if self.task == "causal_lm" else {}

    # -- events

    def _update_size(self) -> None:
        """Rows per epoch and mean text length, for the model picker's CPU time estimate."""
        checked = self.checked is not None and "train" in self.checked
        ds = self.checked["train"] if checked else (
            self.raw[self.train_split] if self.raw is not None and self.train_split in self.raw else None)
        if ds is None:
            self.train_rows, self.text_chars = 0, 0.0
            return
        share = 1.0 if checked or self.eval_split else 1.0 - self.validation_fraction  # split off train
        self.train_rows = int(ds.num_rows * share)
        columns = [] if self.task == "causal_lm" else list(self.text_columns)
        self.text_chars = cpu_time.mean_text_chars(ds, columns)

    def _on_task(self, change) -> None:
        causal, spans = change["new"] == "causal_lm", change["new"] in SPAN_TASKS
        self.label_columns.layout.display = "none" if causal or spans else None
        self.chat.layout.display = None if causal else "none"
        self.spans.layout.display = None if spans else "none"
        self.check_button.description = "Check rows" if causal or spans else "Check labels"
        self.distribution.value, self.chart.value, self.checked = "", b"", None
        if spans:
            self.spans.task = change["new"]
        if causal:
            self._show_chat()
        elif not spans:
            self._on_columns(change)

    def _show_chat(self) -> None:
        if self.task == "causal_lm" and self.chat.rows is not None:  # hidden otherwise: no tokenizer load
            self.chat.max_length = self.max_length
            self.chat.use_model(self.model_name)

    def _on_columns(self, change) -> None:
        self.checked = None
        self.fraction_box.disabled = bool(self.eval_split)
        if self.raw is None or not self.label_column or self.task != "classification":
            return
        try:  # counts of the raw splits, cheap; the checked split comes with check()
            counts = data_checks.label_distribution(self.raw, self.label_column)
            if not counts:  # a column typed from code that is not there: check() explains
                self.distribution.value, self.chart.value = "", b""
                return
            self.distribution.value = note_html(
                "Labels: " + "; ".join(f"{s}: " + ", ".join(f"{k} {v}" for k, v in list(c.items())[:20])
                                       for s, c in counts.items()))
            self.chart.value = label_chart_png(counts)
        except Exception as e:
            self.message.value = error_html(e)


def dataset_picker(**kwargs: Any) -> DatasetPicker:
    """A DatasetPicker; display it in a notebook. ``.dataset_choice`` gives the DatasetChoice."""
    return DatasetPicker(**kwargs)


# ---------------------------------------------------------------- both, with export


def papermill_command(spec: RunSpec, notebook: str = NOTEBOOK, output: str | None = None) -> str:
    """The papermill line that runs ``notebook`` with the spec's choices (notebook parameter names)."""
    d, t = spec.data, spec.train
    if t.task == "causal_lm":  # the notebooks' parameters are a classifier's: a line would mislead
        return ("# papermill: the notebooks here fine-tune classifiers; run a causal LM with the"
                " `workbench train` line above")
    if t.task in SPAN_TASKS:
        return ("# papermill: notebooks/08_ner_and_qa.ipynb runs NER and QA with its own parameters; run this"
                " choice with the `workbench train` line above")
    params: list[tuple[str, Any]] = [("model_name", spec.model.name_or_path)]
    if d.source == "files":
        params.append(("data_files", d.path))
    else:
        params.append(("dataset_name", d.path))
        if d.config_name:
            params.append(("dataset_config", d.config_name))
    params += [("text_column", d.text_columns[0]), ("label_column", d.label_column)]
    for name in ("max_train_rows", "max_eval_rows"):
        if getattr(d, name) is not None:
            params.append((name, getattr(d, name)))
    params += [("num_epochs", t.num_epochs), ("batch_size", t.batch_size),
               ("learning_rate", t.lr), ("max_length", t.max_length),
               ("precision", t.precision), ("output_dir", t.output_dir)]
    output = output or str(Path(t.output_dir) / Path(notebook).name)
    parts = ["papermill", shlex.quote(notebook), shlex.quote(output)]
    for name, value in params:
        parts += ["-p", name, shlex.quote(str(value))]
    line = " ".join(parts)
    if len(d.text_columns) > 1:
        line += ("  # sentence pairs: the notebook takes one text_column; use the parameter file"
                 " with `workbench train` for both")
    return line


class Pickers(widgets.VBox):
    """Both pickers plus export of the choice as a parameter file and command lines."""

    def __init__(self, *, model: ModelPicker | None = None, dataset: DatasetPicker | None = None,
                 train: TrainConfig | None = None, **kwargs: Any):
        self.model = model or ModelPicker()
        self.dataset = dataset or DatasetPicker()
        self.train = train or TrainConfig()
        self.export_path = widgets.Text(value="run.yaml", description="Parameter file",
                                        layout=widgets.Layout(width="60%"))
        self.output_dir = widgets.Text(value=self.train.output_dir, description="Output dir")
        self.export_path.style.description_width = "110px"
        self.export_button = widgets.Button(description="Export", button_style="success")
        self.commands = widgets.HTML()
        self.message = widgets.HTML()
        self.exported: Path | None = None
        self.export_button.on_click(lambda _: self.export())
        # One task for both pickers: a causal LM makes the data chat data, chat data a causal LM.
        widgets.link((self.model, "task"), (self.dataset, "task"))
        widgets.dlink((self.model, "name_or_path"), (self.dataset, "model_name"))
        widgets.dlink((self.model, "seq_len"), (self.dataset, "max_length"))
        for size in ("train_rows", "text_chars"):  # the model picker's CPU time per epoch
            widgets.dlink((self.dataset, size), (self.model, size))
        self.dataset.task_box.layout.display = "none"  # the model picker's toggle sets both
        super().__init__([
            self.model, self.dataset, widgets.HTML("<b>Export for a headless run</b>"),
            widgets.HBox([self.export_path, self.output_dir]), self.export_button,
            self.commands, self.message,
        ], **kwargs)

    @property
    def model_choice(self) -> ModelChoice:
        return self.model.model_choice

    @property
    def dataset_choice(self) -> DatasetChoice:
        return self.dataset.dataset_choice

    def run_spec(self, train: TrainConfig | None = None) -> RunSpec:
        """RunSpec of the current choice; task, batch size, length, precision and checkpointing
        (and for a causal LM the fine-tune mode) come from the model picker, the causal-LM
        data format and columns from the dataset picker, everything else from ``train``
        (default: TrainConfig())."""
        from dataclasses import replace

        base = train or self.train
        causal = {"finetune": self.model.finetune, **self.dataset.train_fields} \
            if self.model.task == "causal_lm" else dict(self.dataset.train_fields)
        base = replace(base, task=self.model.task, batch_size=self.model.batch_size,
                       max_length=self.model.seq_len, precision=self.model.precision,
                       gradient_checkpointing=self.model.gradient_checkpointing,
                       output_dir=self.output_dir.value or base.output_dir, **causal)
        return RunSpec(model=self.model_choice, data=self.dataset_choice, train=base)

    def export(self, path: str | None = None, train: TrainConfig | None = None) -> Path | None:
        """Save the RunSpec (YAML or JSON by extension) and show the equivalent commands."""
        self.message.value = ""
        try:
            spec = self.run_spec(train)
            target = spec.save(path or self.export_path.value or "run.yaml")
        except Exception as e:
            self.message.value = error_html(e)
            return None
        self.exported = target
        cli = f"workbench train --config {shlex.quote(str(target))}"
        self.commands.value = (
            f"<div>Saved <code>{html.escape(str(target))}</code>. Re-run it unchanged:</div>"
            f"<pre>{html.escape(cli)}</pre><pre>{html.escape(papermill_command(spec))}</pre>")
        return target

    def commands_text(self, train: TrainConfig | None = None, config_path: str = "run.yaml") -> str:
        """The two command lines (for scripts and tests)."""
        spec = self.run_spec(train)
        return f"workbench train --config {shlex.quote(config_path)}\n{papermill_command(spec)}"


def pickers(**kwargs: Any) -> Pickers:
    """Model picker, dataset picker and export, in one widget."""
    return Pickers(**kwargs)
