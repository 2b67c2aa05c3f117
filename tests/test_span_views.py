"""The pickers and views with token-classification and question-answering data (no browser):
recognised from the columns, shown as entities and answers, exported, and re-run with
`workbench train --config`."""

from __future__ import annotations

import json

from datasets import ClassLabel, Dataset, Features, List, Value

from workbench.cli import main
from workbench.config import RunSpec
from workbench.widgets.pickers import pickers
from workbench.widgets.span_views import (
    SpanDataView,
    answer_errors_html,
    entity_errors_html,
    tagged_html,
)


def test_tagged_sentence_marks_each_entity_once():
    shown = tagged_html(["Peter", "Blackburn", "visited", "New", "York", "<today>"],
                        ["B-PER", "I-PER", "O", "B-LOC", "I-LOC", "O"])
    assert shown.count("<mark class='wb-entity'") == 2
    assert ">Peter Blackburn<sup" in shown and ">New York<sup" in shown and "&lt;today&gt;" in shown


def test_the_view_reads_integer_tags_by_name_and_answers_in_context():
    features = Features({"tokens": List(Value("string")), "ner_tags": List(ClassLabel(names=["O", "B-ORG"]))})
    view = SpanDataView()
    view.set_rows(Dataset.from_dict({"tokens": [["EU", "rejects"]], "ner_tags": [[1, 0]]}, features=features))
    assert view.train_fields == {"tokens_column": "tokens", "tags_column": "ner_tags"}
    assert ">EU<sup style='font-size:70%;margin-left:2px'>ORG</sup>" in view.preview.value
    view.task = "question_answering"
    view.set_rows(Dataset.from_dict({"question": ["Where?"], "context": ["Born in Warsaw."],
                                     "answers": [{"text": ["Warsaw"], "answer_start": [8]}]}))
    assert "<mark class='wb-answer'" in view.preview.value and ">Warsaw</mark>" in view.preview.value
    assert view.train_fields == {"question_column": "question", "context_column": "context",
                                 "answers_column": "answers"}


def test_the_picker_recognises_conll_files_and_its_export_trains(tiny_span_bert, ner_folder, tmp_path):
    both = pickers()
    both.model.select(str(tiny_span_bert))
    both.dataset.path = str(ner_folder)
    assert both.dataset.load(), both.dataset.message.value
    assert both.dataset.task == "token_classification" and both.model.task == "token_classification"
    assert both.dataset.spans.layout.display is None and both.dataset.label_columns.layout.display == "none"
    assert both.dataset.spans.preview.value.count("<mark class='wb-entity'") >= 3
    assert both.dataset.check(), both.dataset.message.value
    assert "Every row is a valid token classification example" in both.dataset.distribution.value
    both.model.select(str(tiny_span_bert))  # choosing a model again keeps the task the data chose
    assert both.model.task == "token_classification"
    both.model.batch_size, both.model.seq_len = 8, 64
    both.output_dir.value = str(tmp_path / "run")
    target = both.export(str(tmp_path / "run.yaml"))
    assert target is not None, both.message.value
    spec = RunSpec.load(target)
    assert spec.train.task == "token_classification" and spec.train.tags_column == "ner_tags"
    assert "08_ner_and_qa" in both.commands.value

    assert main(["train", "--config", str(target), "--progress", "none", "--set", "train.max_steps=2",
                 "--set", "train.num_workers=0"]) == 0
    labels = json.loads((tmp_path / "run" / "model" / "labels.json").read_text())
    assert labels["scheme"] == "IOB2" and labels["subword_labels"] == "all"
    assert "entity errors" in entity_errors_html(tmp_path / "run" / "model")  # an untrained model errs
    card = (tmp_path / "run" / "model" / "README.md").read_text()
    assert "pipeline_tag: token-classification" in card and 'aggregation_strategy="simple"' in card
    assert "| tag scheme | IOB2 |" in card and "every sub-word of a word" in card


def test_the_picker_recognises_squad_files(tiny_span_bert, qa_folder):
    both = pickers()
    both.dataset.path = str(qa_folder)
    assert both.dataset.load()
    assert both.dataset.task == "question_answering"
    assert both.dataset.spans.preview.value.count("<mark class='wb-answer'") == 3
    assert both.dataset.check(), both.dataset.message.value
    both.model.select(str(tiny_span_bert))
    spec = both.run_spec()
    assert (spec.train.task, spec.train.answers_column, spec.data.text_columns) == (
        "question_answering", "answers", ("question", "context"))


def test_answer_errors_read_the_saved_predictions(tmp_path):
    rows = [{"question": "Where?", "context": "Born in Warsaw.", "prediction": "in Warsaw", "start": 5,
             "answers": ["Warsaw"], "exact_match": 0, "f1": 2 / 3},
            {"question": "Who?", "context": "Born in Warsaw.", "prediction": "Warsaw", "start": 8,
             "answers": ["Curie"], "exact_match": 0, "f1": 0.0},
            {"question": "What?", "context": "x", "prediction": "x", "start": 0, "answers": ["x"],
             "exact_match": 1, "f1": 1.0}]
    (tmp_path / "eval_predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    shown = answer_errors_html(tmp_path)
    assert "2 of 3 answers are not exact: 1 overlap the reference (F1 &gt; 0), 1 miss it entirely" in shown
    assert shown.index("Who?") < shown.index("Where?")  # the worst first
