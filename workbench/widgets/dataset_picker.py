"""The dataset picker: choose a hub dataset or local files, preview them, pick columns, see the labels.

Its own module since the pickers passed ~600 lines (``widgets/pickers.py`` keeps the model picker,
the combined picker and the export). The work is done by workbench.sources (data, data_checks), the
same functions ``fit`` runs; every action catches errors and writes them to ``message``. Chat and
prompt/completion data are shown by workbench.widgets.causal_views, words + tags and question +
context + answers by workbench.widgets.span_views.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets
import traitlets

from workbench.config import DatasetChoice
from workbench.errors import DataError, WorkbenchError
from workbench.sources import cpu_time, data, data_checks
from workbench.widgets.causal_views import ChatDataView, find_chat_columns
from workbench.widgets.html_blocks import WARNING, error_html, note_html, table_html
from workbench.widgets.label_chart import label_chart_png
from workbench.widgets.span_views import SpanDataView

TASK_OPTIONS = [("Classification", "classification"), ("Causal LM", "causal_lm"),
                ("Token classification", "token_classification"), ("Question answering", "question_answering")]
SPAN_TASKS = ("token_classification", "question_answering")  # their data view: span_views.SpanDataView


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
