"""CoNLL and SQuAD files read as they are (sources/span_files.py through data_files.py), the
places an error names in them, and which task the columns say (data_checks.detect_task)."""

from __future__ import annotations

import json

import pytest
from datasets import Dataset
from span_fixtures import CONLL_SENTENCES, write

from workbench.config import DatasetChoice
from workbench.errors import DataError
from workbench.sources import data_files
from workbench.sources.data import load_splits
from workbench.sources.data_checks import detect_task, find_token_columns


def test_conll_file_skips_docstart_and_takes_the_last_column(tmp_path):
    path = write(tmp_path / "eng.train.conll", CONLL_SENTENCES)
    splits = data_files.load_files(path)
    train = splits["train"]
    assert train.num_rows == 4  # the -DOCSTART- line and its blank line make no sentence
    assert train[0]["tokens"] == ["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."]
    assert train[0]["ner_tags"] == ["B-ORG", "O", "B-MISC", "O", "O", "O", "B-MISC", "O", "O"]
    assert train[3]["ner_tags"][:3] == ["O", "B-ORG", "I-ORG"]
    origin = data_files.RowOrigin([str(path)], str(path), "train")
    assert origin.describe(1) == f"{path} line 13"  # "Peter" opens the second sentence
    assert origin.describe(3, word=2) == f"{path} line 21"  # "Commission": a token has its own line


def test_conll_tabs_allow_spaces_in_tokens_and_windows_line_ends(tmp_path):
    path = tmp_path / "data.conll"
    path.write_bytes(b"New York\tB-LOC\r\nis\tO\r\n\r\nfun\tO\r\n")
    rows = data_files.load_files(path)["train"]
    assert rows["tokens"] == [["New York", "is"], ["fun"]]


@pytest.mark.parametrize(("text", "line", "what"), [
    ("EU B-ORG\nrejects\n", 2, "has no tag column"),
    ("EU NNP B-ORG\nrejects VBZ B-VP O\n", 2, "has 4 columns"),
])
def test_bad_conll_lines_name_the_file_and_line(tmp_path, text, line, what):
    path = write(tmp_path / "train.conll", text)
    with pytest.raises(DataError, match=what) as info:
        data_files.load_files(path)
    assert f"{path} line {line}" in str(info.value)


def test_conll_folder_convention_valid_and_txt(tmp_path):
    write(tmp_path / "train.txt", CONLL_SENTENCES)
    write(tmp_path / "valid.txt", "Rome NNP B-NP B-LOC\n")
    splits = load_splits(DatasetChoice(source="files", path=str(tmp_path)))
    assert set(splits) == {"train", "validation"} and splits["validation"][0]["ner_tags"] == ["B-LOC"]
    assert detect_task(splits["train"]) == "token_classification"


SQUAD = {"version": "v2.0", "data": [{"title": "Warsaw", "paragraphs": [
    {"context": "Marie Curie was born in Warsaw in 1867.",
     "qas": [{"id": "a1", "question": "Where was Marie Curie born?",
              "answers": [{"text": "Warsaw", "answer_start": 24}, {"text": "in Warsaw", "answer_start": 21}]},
             {"id": "a2", "question": "When did she die?", "answers": [], "is_impossible": True,
              "plausible_answers": [{"text": "1867", "answer_start": 34}]}]}]}]}


def test_squad_json_becomes_one_row_per_question(tmp_path):
    write(tmp_path / "train-v2.0.json", json.dumps(SQUAD, indent=2))
    write(tmp_path / "dev-v2.0.json", json.dumps(SQUAD))  # one line, as the official files are
    splits = load_splits(DatasetChoice(source="files", path=str(tmp_path)))
    train = splits["train"]
    assert train.column_names[:5] == ["id", "title", "context", "question", "answers"]
    assert train[0]["answers"] == {"text": ["Warsaw", "in Warsaw"], "answer_start": [24, 21]}
    assert train[1]["answers"] == {"text": [], "answer_start": []}  # unanswerable: plausible ones ignored
    assert detect_task(train) == "question_answering"
    pretty = data_files.RowOrigin([str(tmp_path / "train-v2.0.json")], "", "train")
    assert pretty.describe(1) == (f"{tmp_path / 'train-v2.0.json'} line 25, "
                                  "data[0].paragraphs[0].qas[1] (id 'a2')")
    one_line = data_files.RowOrigin([str(tmp_path / "dev-v2.0.json")], "", "validation")
    assert one_line.describe(0) == f"{tmp_path / 'dev-v2.0.json'} data[0].paragraphs[0].qas[0] (id 'a1')"


def test_broken_squad_entries_are_named_by_their_path(tmp_path):
    broken = json.loads(json.dumps(SQUAD))
    del broken["data"][0]["paragraphs"][0]["qas"][1]["question"]
    path = write(tmp_path / "train.json", json.dumps(broken))
    with pytest.raises(DataError, match=r"data\[0\]\.paragraphs\[0\]\.qas\[1\] has no 'question'"):
        data_files.load_files(path)
    records = write(tmp_path / "mixed" / "train.json", json.dumps(SQUAD))
    write(records.parent / "validation.json", json.dumps([{"question": "q", "context": "c"}]))
    with pytest.raises(DataError, match="mixes SQuAD-format JSON"):
        data_files.load_files(records.parent)


def test_detect_task_from_columns():
    assert detect_task(Dataset.from_dict({"text": ["a"], "label": [1]})) == "classification"
    assert detect_task(Dataset.from_dict({"words": [["a"]], "tags": [["O"]]})) == "token_classification"
    # "labels" holding one value per row is a classifier's, not a tag list
    assert detect_task(Dataset.from_dict({"tokens": [["a"]], "labels": [1]})) == "classification"
    assert detect_task(Dataset.from_dict({"prompt": ["a"], "completion": ["b"]})) == "causal_lm"
    assert find_token_columns(Dataset.from_dict({"tokens": [["a"]], "ner": [["O"]]})) == ("tokens", "ner")


def test_a_hub_loading_script_is_read_from_the_parquet_export(monkeypatch):
    """datasets 4 refuses loading scripts (eriktks/conll2003 is one); the Hub's Parquet copy of it loads."""
    import datasets

    from workbench.sources import data

    asked = []

    def load_dataset(name, config_name=None, revision=None):
        asked.append(revision)
        if revision is None:
            raise RuntimeError("Dataset scripts are no longer supported, but found conll2003.py")
        return datasets.DatasetDict(train=Dataset.from_dict({"tokens": [["EU"]], "ner_tags": [[3]]}))

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    assert data.load_hub("eriktks/conll2003")["train"][0]["tokens"] == ["EU"]
    assert asked == [None, "refs/convert/parquet"]
