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

The dataset picker is in workbench.widgets.dataset_picker (imported here, so
``workbench.widgets.pickers.DatasetPicker`` and ``workbench.dataset_picker`` stay where they were).
"""

from __future__ import annotations

import html
import shlex
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import traitlets

from workbench.config import PRECISIONS, DatasetChoice, ModelChoice, RunSpec, TrainConfig
from workbench.errors import WorkbenchError
from workbench.sources import cpu_time, models, vram, vram_causal
from workbench.widgets.causal_views import causal_estimate_html, causal_model_html
from workbench.widgets.dataset_picker import SPAN_TASKS, TASK_OPTIONS, DatasetPicker
from workbench.widgets.html_blocks import WARNING, error_html, note_html

NOTEBOOK = "notebooks/01_quickstart.ipynb"  # the notebook the papermill line runs


# ---------------------------------------------------------------- model picker


class ModelPicker(widgets.VBox):
    """Pick a discovered model or type a hub id / folder; see its config and memory estimate.

    State (traitlets): ``name_or_path``, ``precision``, ``batch_size``, ``seq_len``,
    ``gradient_checkpointing``, ``task`` (classification | causal_lm: set from the chosen
    model, changeable) and ``finetune`` (full | lora | qlora, causal LMs). ``info`` is the
    selected ModelInfo (None until one loads); ``fit`` the latest vram.FitCheck
    (classification), ``causal_fit`` the latest vram_causal.CausalFitCheck and ``facts`` the
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
        self.causal_fit: vram_causal.CausalFitCheck | None = None
        self.facts: models.CausalFacts | None = None
        self.cpu_time: cpu_time.CpuTimeEstimate | None = None
        self.auto_batch: str | None = None  # what batch_size="auto" would use, in words
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
        self.estimate.value = (note_html(self.fit.message, color)
                               + self._auto_batch_html(self.fit.free_bytes, self.fit.estimate.precision)
                               + self._cpu_time_html(self.fit.free_bytes))

    def _update_causal_estimate(self) -> None:
        self.fit, self.causal_fit = None, None
        if self.facts is None:  # not a decoder: the message says so
            self.estimate.value = ""
            return
        try:
            self.causal_fit = vram_causal.check_causal_fit(
                self.info, batch_size=self.batch_size, seq_len=self.seq_len, precision=self.precision,
                free_bytes=self._free_bytes, gpu_name="the GPU" if self._free_bytes else None,
                device_index=self._device_index, nvml=self._nvml)
        except Exception as e:
            self.estimate.value = error_html(e)
            return
        chosen = self.causal_fit.estimates[(self.finetune, self.gradient_checkpointing)]
        self.estimate.value = (causal_estimate_html(self.causal_fit, self.finetune, self.gradient_checkpointing)
                               + self._auto_batch_html(self.causal_fit.free_bytes, chosen.precision)
                               + self._cpu_time_html(self.causal_fit.free_bytes))

    def _auto_batch_html(self, free_bytes: int | None, precision: str) -> str:
        """What ``batch_size="auto"`` would use with this model and these settings (engine/batch_size.py)."""
        from workbench.engine import batch_size as auto_batch

        self.auto_batch = None
        peak = None if free_bytes is None else auto_batch.peak_function(
            self.info, task=self.task, precision=precision, max_length=self.seq_len,
            gradient_checkpointing=self.gradient_checkpointing, finetune=self.finetune)
        self.auto_batch = auto_batch.describe_auto(peak, free_bytes, rows=self.train_rows or None)
        return note_html(self.auto_batch)

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
