"""What a notebook shows for token classification and question answering: data previews for the
dataset picker, two playgrounds, and the error analysis of a run.

    SpanDataView       the dataset picker's columns and preview: sentences with their entities
                       highlighted, or questions with the answer marked in the context
    EntityPlayground   type a sentence, see the entities the fine-tuned model finds
    AnswerPlayground   paste a text, ask a question, see the answer in context and its score
    entity_errors_html / answer_errors_html   what a run got wrong (from its eval_predictions.jsonl)

The playgrounds load the saved model with ``transformers.pipeline`` exactly as a user would
(``"token-classification"`` with ``aggregation_strategy="simple"``; ``"question-answering"``
with ``trust_remote_code=True``: the pipeline file saved beside the model, with the run's
settings), so what they show is what a reload gives.
"""

from __future__ import annotations

import html
from collections import Counter
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import traitlets

from workbench.config import TrainConfig
from workbench.sources import data_checks
from workbench.tasks.base import read_predictions
from workbench.tasks.token_classification_data import entity_errors, entity_spans
from workbench.widgets.html_blocks import WARNING, error_html, note_html

# Entity colours: displaCy's for the CoNLL types, a cycle for the rest.
COLORS = {"PER": "#ddd6fe", "ORG": "#7aecec", "LOC": "#ff9561", "MISC": "#fde68a", "GPE": "#feca74"}
CYCLE = ["#bfdbfe", "#bbf7d0", "#fecaca", "#e9d5ff", "#fed7aa", "#a7f3d0"]
ANSWER_STYLE = "background:#c8e6c9;padding:0 2px;border-radius:3px"


def color_of(kind: str) -> str:
    return COLORS.get(kind) or CYCLE[sum(map(ord, kind)) % len(CYCLE)]


def _mark(text: str, kind: str, score: float | None = None) -> str:
    title = f" title='{kind} {score:.2f}'" if score is not None else ""
    return (f"<mark class='wb-entity' data-type='{html.escape(kind)}'{title} style='background:{color_of(kind)};"
            f"padding:0 3px;border-radius:3px'>{html.escape(text)}<sup style='font-size:70%;margin-left:2px'>"
            f"{html.escape(kind)}</sup></mark>")


def tagged_html(words: list[str], tags: list[str]) -> str:
    """A sentence with its entities highlighted (type after each), words joined by spaces."""
    spans = {start: (kind, end) for kind, start, end in entity_spans(tags)}
    parts, i = [], 0
    while i < len(words):
        if i in spans:
            kind, end = spans[i]
            parts.append(_mark(" ".join(words[i:end + 1]), kind))
            i = end + 1
        else:
            parts.append(html.escape(words[i]))
            i += 1
    return f"<div class='wb-tagged'>{' '.join(parts)}</div>"


def text_entities_html(text: str, entities: list[dict]) -> str:
    """``text`` with a pipeline's aggregated entities (``start``, ``end``, ``entity_group``) marked."""
    parts, at = [], 0
    for entity in sorted(entities, key=lambda e: e["start"]):
        if entity["start"] < at:
            continue
        parts += [html.escape(text[at:entity["start"]]),
                  _mark(text[entity["start"]:entity["end"]], entity["entity_group"], float(entity["score"]))]
        at = entity["end"]
    parts.append(html.escape(text[at:]))
    return f"<div class='wb-tagged' style='white-space:pre-wrap'>{''.join(parts)}</div>"


def answer_in_context_html(context: str, start: int | None, end: int | None, width: int = 300) -> str:
    """The context around ``[start, end)`` with the answer highlighted (the whole context when short)."""
    if start is None or end is None:
        return f"<div class='wb-context'>{html.escape(context[:2 * width])}</div>"
    left, right = max(0, start - width), min(len(context), end + width)
    before = ("..." if left else "") + context[left:start]
    after = context[end:right] + ("..." if right < len(context) else "")
    return (f"<div class='wb-context' style='white-space:pre-wrap'>{html.escape(before)}"
            f"<mark class='wb-answer' style='{ANSWER_STYLE}'>{html.escape(context[start:end])}</mark>"
            f"{html.escape(after)}</div>")


# ---------------------------------------------------------------- the dataset picker's view
class SpanDataView(widgets.VBox):
    """Which columns hold words and tags (or question, context, answers), and the first rows shown
    as the task reads them. ``train_fields`` gives the column settings for the export."""

    task = traitlets.Unicode("token_classification")
    COLUMNS = {"token_classification": ("tokens_column", "tags_column"),
               "question_answering": ("question_column", "context_column", "answers_column")}

    def __init__(self, rows_shown: int = 3, **kwargs: Any):
        self.rows_shown = rows_shown
        self.rows = None  # the train split
        self.boxes = {name: widgets.Dropdown(description=name.replace("_column", "").capitalize())
                      for names in self.COLUMNS.values() for name in names}
        for box in self.boxes.values():
            box.style.description_width = "110px"
            box.observe(lambda _: self.render(), "value")
        self.preview = widgets.HTML()
        super().__init__([widgets.HBox(list(self.boxes.values())), self.preview], **kwargs)
        self.observe(lambda _: self.render(), "task")

    @property
    def train_fields(self) -> dict[str, str]:
        """The TrainConfig column fields of this choice (only those set)."""
        return {name: self.boxes[name].value for name in self.COLUMNS[self.task] if self.boxes[name].value}

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(self.train_fields.values())

    def set_rows(self, ds) -> None:
        """New data: offer its columns, take the ones the task's names find, render."""
        self.rows = ds
        names = [n for n in ds.column_names if n != "__workbench_row__"]
        found = data_checks.find_token_columns(ds) or ("", "")
        guesses = {"tokens_column": found[0], "tags_column": found[1], "question_column": "question",
                   "context_column": "context", "answers_column": "answers"}
        with self.hold_trait_notifications():
            for name, box in self.boxes.items():
                box.options = [("(choose)", "")] + [(n, n) for n in names]
                box.value = guesses[name] if guesses[name] in names else ""
        self.render()

    def check(self, choice):
        """The splits loaded as a run loads them, every row checked by the task; raises DataError."""
        from workbench.sources import data
        from workbench.tasks import make_task

        splits = data.load_splits(choice)
        make_task(TrainConfig(task=self.task, **self.train_fields), (), None).check_data(splits)
        return splits

    def render(self) -> None:
        for name, box in self.boxes.items():
            box.layout.display = None if name in self.COLUMNS[self.task] else "none"
        if self.rows is None or len(self.rows) == 0:
            self.preview.value = ""
            return
        try:
            shown = self.rows.select(range(min(self.rows_shown, len(self.rows))))
            body = (self._sentences(shown) if self.task == "token_classification" else self._questions(shown))
            self.preview.value = "<b>First rows, as the task reads them</b>" + body
        except Exception as e:  # columns that do not hold this format: say so, keep the widget alive
            self.preview.value = note_html(f"The first rows cannot be read as {self.task.replace('_', ' ')} data "
                                           f"({type(e).__name__}: {e}): choose the columns above.", WARNING)

    def _sentences(self, shown) -> str:
        tokens, tags = self.boxes["tokens_column"].value, self.boxes["tags_column"].value
        if not tokens or not tags:
            return note_html("Choose the columns with the words and the tags.", WARNING)
        feature = getattr(shown.features[tags], "feature", None)
        names = list(feature.names) if hasattr(feature, "names") else None
        out = []
        for row in shown:
            row_tags = [names[t] for t in row[tags]] if names else list(row[tags])
            out.append(tagged_html(list(row[tokens]), row_tags))
        return "".join(out)

    def _questions(self, shown) -> str:
        q, c, a = (self.boxes[n].value for n in self.COLUMNS["question_answering"])
        if not (q and c and a):
            return note_html("Choose the question, context and answers columns.", WARNING)
        out = []
        for row in shown:
            answers = row[a] or {}
            texts, starts = answers.get("text") or [], answers.get("answer_start") or []
            start = starts[0] if starts else None
            end = start + len(texts[0]) if texts and start is not None else None
            said = html.escape(texts[0]) if texts else "<i>no answer (unanswerable)</i>"
            out.append(f"<div class='wb-question'><b>Q:</b> {html.escape(row[q])} <b>A:</b> {said}</div>"
                       + answer_in_context_html(row[c], start, end, width=150))
        return "".join(out)


# ---------------------------------------------------------------------------- playgrounds
class EntityPlayground:
    """Type a sentence; the model's entities are highlighted, each with its type and score."""

    def __init__(self, model_dir: str | Path, *, device: str | int | None = None):
        from transformers import pipeline

        self.model_dir = Path(model_dir)
        self.pipe = pipeline("token-classification", model=str(self.model_dir), aggregation_strategy="simple",
                             device=device)
        self.text = widgets.Textarea(placeholder="Type a sentence: Angela Merkel met Emmanuel Macron in Paris.",
                                     layout=widgets.Layout(width="100%"))
        self.button = widgets.Button(description="Find entities", button_style="primary")
        self.output = widgets.HTML()
        self.entities: list[dict] = []
        self.button.on_click(lambda _: self.run())
        self.widget = widgets.VBox([self.text, self.button, self.output])

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)

    def run(self, text: str | None = None) -> list[dict]:
        """The entities in ``text`` (default: the box), shown highlighted; errors shown, not raised."""
        if text is not None:
            self.text.value = text
        try:
            self.entities = [{**e, "score": float(e["score"])} for e in self.pipe(self.text.value)]
            listed = ", ".join(f"{e['word']} ({e['entity_group']} {e['score']:.2f})" for e in self.entities)
            self.output.value = text_entities_html(self.text.value, self.entities) + note_html(
                listed or "No entity found.")
        except Exception as e:  # a widget never raises into the notebook
            self.entities = []
            self.output.value = error_html(e)
        return self.entities


class AnswerPlayground:
    """Paste a text and ask a question; the answer is shown in its context with its score."""

    def __init__(self, model_dir: str | Path, *, device: str | int | None = None):
        from transformers import pipeline

        self.model_dir = Path(model_dir)
        # The pipeline saved beside the model (transformers 5 has none of its own): trust_remote_code
        # runs that file, the workbench's qa_pipeline.py, with the run's window settings as defaults.
        self.pipe = pipeline("question-answering", model=str(self.model_dir), device=device, trust_remote_code=True)
        self.settings = self.pipe.settings()
        self.context = widgets.Textarea(placeholder="Paste a text here.",
                                        layout=widgets.Layout(width="100%", height="140px"))
        self.question = widgets.Text(placeholder="Ask a question about it.", layout=widgets.Layout(width="100%"))
        self.button = widgets.Button(description="Answer", button_style="primary")
        self.output = widgets.HTML()
        self.answer: dict | None = None
        self.button.on_click(lambda _: self.run())
        self.widget = widgets.VBox([self.context, self.question, self.button, self.output])

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)

    def run(self, question: str | None = None, context: str | None = None) -> dict | None:
        """The answer (``answer``, ``score``, ``start``, ``end``) shown in context; errors shown, not raised."""
        if question is not None:
            self.question.value = question
        if context is not None:
            self.context.value = context
        try:
            answer = self.pipe(question=self.question.value, context=self.context.value)
            self.answer = {**answer, "score": float(answer["score"])}
            if not self.answer["answer"]:
                self.output.value = note_html(f"No answer in this text (score {self.answer['score']:.2f}).")
            else:
                self.output.value = (note_html(f"Answer: {self.answer['answer']}  (score {self.answer['score']:.2f})")
                                     + answer_in_context_html(self.context.value, answer["start"], answer["end"]))
        except Exception as e:  # a widget never raises into the notebook
            self.answer = None
            self.output.value = error_html(e)
        return self.answer


# ---------------------------------------------------------------------------- error analysis
def entity_error_rows(model_dir: str | Path) -> list[dict]:
    """Every entity the evaluation saved beside ``model_dir`` got wrong (token_classification_data.entity_errors)."""
    return [error for row in read_predictions(model_dir)
            for error in entity_errors(row["words"], row["gold"], row["predicted"])]


def answer_error_rows(model_dir: str | Path) -> list[dict]:
    """The questions whose saved answer is not an exact match, worst F1 first."""
    wrong = [row for row in read_predictions(model_dir) if not row.get("exact_match")]
    return sorted(wrong, key=lambda row: row.get("f1", 0.0))


def _table(rows: list[dict], columns: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{row.get(c, '')}</td>" for c in columns) + "</tr>" for row in rows)
    return f"<table class='wb-errors'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def entity_errors_html(model_dir: str | Path, limit: int = 20) -> str:
    """Counts of each kind of entity error, then the first ``limit`` of them."""
    errors = entity_error_rows(model_dir)
    if not errors:
        return note_html("No entity errors in the saved evaluation." if read_predictions(model_dir)
                         else f"No eval_predictions.jsonl in {model_dir}.")
    counts = Counter(e["error"] for e in errors)
    kinds = Counter(e["expected"] or e["predicted"].split(":")[0] for e in errors)
    summary = (f"{len(errors)} entity errors: " + ", ".join(f"{k} {n}" for k, n in counts.most_common())
               + "\nBy type: " + ", ".join(f"{k} {n}" for k, n in kinds.most_common()))
    rows = [{k: html.escape(str(v)) for k, v in e.items()} for e in errors[:limit]]
    return note_html(summary) + _table(rows, ["error", "entity", "expected", "predicted", "sentence"])


def answer_errors_html(model_dir: str | Path, limit: int = 20) -> str:
    """How many answers were not exact, then the ``limit`` worst with the span in context."""
    predictions = read_predictions(model_dir)
    wrong = answer_error_rows(model_dir)
    if not predictions:
        return note_html(f"No eval_predictions.jsonl in {model_dir}.")
    partial = sum(1 for row in wrong if row.get("f1", 0) > 0)
    summary = (f"{len(wrong)} of {len(predictions)} answers are not exact: {partial} overlap the reference "
               f"(F1 > 0), {len(wrong) - partial} miss it entirely.")
    rows = []
    for row in wrong[:limit]:
        context, predicted, start = row.get("context", ""), row["prediction"], row.get("start")
        shown = answer_in_context_html(context, start, start + len(predicted), width=80) if start is not None else ""
        rows.append({"question": html.escape(row["question"]),
                     "predicted": html.escape(predicted) or "<i>no answer</i>",
                     "expected": html.escape(" | ".join(row["answers"])) or "<i>no answer</i>",
                     "F1": f"{row.get('f1', 0):.2f}", "in context": shown})
    return note_html(summary) + _table(rows, ["question", "predicted", "expected", "F1", "in context"])
