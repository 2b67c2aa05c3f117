"""workbench.sources.data, data_files, data_checks: every supported local format, every bad input, stratified splits."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from workbench.config import DatasetChoice
from workbench.errors import DataError
from workbench.sources import data_checks
from workbench.sources.data import load_choice, stratified_split
from workbench.sources.data_checks import label_distribution, suggest_columns
from workbench.sources.data_files import check_utf8
from workbench.sources.synthetic import make_rows, write_csv


def choice(path, **kw) -> DatasetChoice:
    kw.setdefault("text_columns", ("text",))
    return DatasetChoice(source="files", path=str(path), **kw)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# ---------------------------------------------------------------- formats


def test_csv_without_validation_gets_stratified_split(tmp_path):
    path = write_csv(tmp_path / "reviews.csv", 100)
    ds = load_choice(choice(path, validation_fraction=0.2))
    assert ds["train"].num_rows == 80 and ds["validation"].num_rows == 20
    assert label_distribution(ds, "label")["validation"] == {"negative": 10, "positive": 10}
    assert ds["train"].column_names == ["text", "label"]


def test_tsv(tmp_path):
    rows = make_rows(40)
    path = tmp_path / "data.tsv"
    path.write_text("sentence\tsentiment\n" + "".join(f"{r['text']}\t{r['label']}\n" for r in rows),
                    encoding="utf-8")
    ds = load_choice(choice(path, text_columns=("sentence",), label_column="sentiment"))
    assert ds["train"].num_rows + ds["validation"].num_rows == 40
    assert ds["train"][0]["sentence"] in {r["text"] for r in rows}


def test_json_array_and_jsonl(tmp_path):
    rows = make_rows(30)
    array = tmp_path / "data.json"
    array.write_text(json.dumps(rows), encoding="utf-8")
    lines = write_jsonl(tmp_path / "data.jsonl", rows)
    for path in (array, lines):
        ds = load_choice(choice(path, validation_fraction=0.2))
        assert ds["validation"].num_rows == 6
        assert set(ds["train"]["label"]) == {"positive", "negative"}


def test_parquet_with_int_labels(tmp_path):
    from datasets import Dataset

    rows = [{"text": r["text"], "label": int(r["label"] == "positive")} for r in make_rows(50)]
    path = tmp_path / "data.parquet"
    Dataset.from_list(rows).to_parquet(str(path))
    ds = load_choice(choice(path, validation_fraction=0.2))
    assert set(ds["validation"]["label"]) == {0, 1}
    assert ds["validation"].num_rows == 10


def test_folder_with_named_splits(tmp_path):
    write_csv(tmp_path / "train.csv", 60)
    write_csv(tmp_path / "validation.csv", 14, seed=1)
    write_csv(tmp_path / "test.csv", 10, seed=2)
    ds = load_choice(choice(tmp_path))
    assert ds["train"].num_rows == 60 and ds["validation"].num_rows == 14


def test_folder_without_split_names_is_all_train(tmp_path):
    write_csv(tmp_path / "part1.csv", 30)
    write_csv(tmp_path / "part2.csv", 30, seed=1)
    ds = load_choice(choice(tmp_path, eval_split=None, validation_fraction=0.5))
    assert ds["train"].num_rows == 30 and ds["validation"].num_rows == 30


def test_row_caps(tmp_path):
    write_csv(tmp_path / "train.csv", 100)
    write_csv(tmp_path / "validation.csv", 50, seed=1)
    ds = load_choice(choice(tmp_path, max_train_rows=20, max_eval_rows=10))
    assert (ds["train"].num_rows, ds["validation"].num_rows) == (20, 10)


# ---------------------------------------------------------------- bad inputs


def expect(path, match, **kw):
    with pytest.raises(DataError, match=match) as info:
        load_choice(choice(path, **kw))
    assert info.value.fix, "every DataError says what to do"
    return info.value


def test_missing_file(tmp_path):
    expect(tmp_path / "nope.csv", "does not exist")


def test_empty_file(tmp_path):
    (tmp_path / "empty.csv").write_bytes(b"")
    expect(tmp_path / "empty.csv", "is empty")


def test_header_only_csv_has_no_rows(tmp_path):
    (tmp_path / "head.csv").write_text("text,label\n", encoding="utf-8")
    expect(tmp_path / "head.csv", "no data rows")


def test_garbage_parquet(tmp_path):
    (tmp_path / "bad.parquet").write_bytes(b"this is not parquet at all")
    expect(tmp_path / "bad.parquet", "not a Parquet file")


def test_malformed_jsonl_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine", "label": "a"}\n{"text": "broken", "label": \n', encoding="utf-8")
    expect(path, r"not valid JSON.*line 2")


def test_malformed_json_array(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[{"text": "a", "label": 1},\n {"text": "b" "label": 2}]', encoding="utf-8")
    expect(path, r"not valid JSON.*line 2")


def test_non_utf8_names_the_byte_offset(tmp_path):
    path = tmp_path / "latin.csv"
    head = b"text,label\ngood movie,positive\n"
    path.write_bytes(head + "café bad,negative\n".encode("latin-1"))
    error = expect(path, "not UTF-8")
    offset = len(head) + len("caf")
    assert f"byte {offset}" in error.message
    assert "iconv" in error.fix


def test_utf8_check_across_chunk_boundary(tmp_path, monkeypatch):
    import workbench.sources.data_files as data_files

    monkeypatch.setattr(data_files, "UTF8_CHUNK", 4)
    path = tmp_path / "ok.csv"
    path.write_text("ab\u00e9\u20accd", encoding="utf-8")  # multi-byte characters split by chunks
    check_utf8(path)
    path.write_bytes(b"abcdefg\xff")
    with pytest.raises(DataError, match="byte 7"):
        check_utf8(path)


def test_missing_column_lists_available(tmp_path):
    path = write_csv(tmp_path / "d.csv", 20)
    error = expect(path, "column 'review' is not in split 'train'", text_columns=("review",))
    assert "text, label" in error.message
    expect(path, "column 'target'", label_column="target")


def test_mixed_label_types_json(tmp_path):
    rows = [{"text": "a", "label": 1}, {"text": "b", "label": "positive"}, {"text": "c", "label": 0}]
    path = write_jsonl(tmp_path / "mixed.jsonl", rows)
    expect(path, "mixes value types")


def test_mixed_label_types_csv(tmp_path):
    (tmp_path / "mixed.csv").write_text("text,label\na,1\nb,positive\nc,0\n", encoding="utf-8")
    expect(tmp_path / "mixed.csv", "mixes numbers and names")


def test_single_class(tmp_path):
    (tmp_path / "one.csv").write_text("text,label\na,pos\nb,pos\nc,pos\n", encoding="utf-8")
    expect(tmp_path / "one.csv", "single class")


def test_validation_labels_unknown_to_train(tmp_path):
    write_csv(tmp_path / "train.csv", 20)
    (tmp_path / "validation.csv").write_text("text,label\na,neutral\nb,positive\n", encoding="utf-8")
    expect(tmp_path, "labels that train does not")


def test_unsupported_extension(tmp_path):
    (tmp_path / "data.xlsx").write_bytes(b"PK")
    expect(tmp_path / "data.xlsx", "does not read")


def test_offline_hub_dataset_is_a_data_error():
    with pytest.raises(DataError, match="could not load hub dataset") as info:
        load_choice(DatasetChoice(source="hub", path="stanfordnlp/sst2", text_columns=("sentence",)))
    assert "offline" in info.value.fix or "hub" in info.value.fix


# ---------------------------------------------------------------- split and suggestions


def test_stratified_split_keeps_proportions_and_string_labels():
    from datasets import Dataset

    labels = ["spam"] * 160 + ["ham"] * 40
    ds = Dataset.from_dict({"text": [f"t{i}" for i in range(200)], "label": labels})
    train, validation = stratified_split(ds, "label", 0.25, seed=7)
    assert Counter(validation["label"]) == {"spam": 40, "ham": 10}
    assert Counter(train["label"]) == {"spam": 120, "ham": 30}
    assert train.features["label"].dtype in ("string", "large_string")
    again = stratified_split(ds, "label", 0.25, seed=7)[1]
    assert again["text"] == validation["text"], "a fixed seed gives the same split"
    other = stratified_split(ds, "label", 0.25, seed=8)[1]
    assert other["text"] != validation["text"]


def test_split_refuses_a_class_with_one_row():
    from datasets import Dataset

    ds = Dataset.from_dict({"text": list("abcde"), "label": ["x", "x", "x", "x", "y"]})
    with pytest.raises(DataError, match="single row"):
        stratified_split(ds, "label", 0.4, seed=0)


@pytest.mark.parametrize(
    "columns, expected",
    [
        (["text", "label"], (("text",), "label")),
        (["idx", "sentence", "label"], (("sentence",), "label")),
        (["sentence1", "sentence2", "label"], (("sentence1", "sentence2"), "label")),
        (["question", "sentence", "label"], (("question", "sentence"), "label")),
        (["Review", "Sentiment"], (("Review",), "Sentiment")),
        (["content", "category"], (("content",), "category")),
        (["a", "b"], ((), None)),
    ],
)
def test_suggest_columns(columns, expected):
    assert suggest_columns(columns) == expected


# ---------------------------------------------------------------- text as written (issue 11)


def write_rows_csv(path, rows, extra_lines=""):
    import csv

    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=["text", "label"])
        writer.writeheader()
        writer.writerows(rows)
        f.write(extra_lines)
    return path


def test_na_and_none_in_a_csv_text_column_stay_text(tmp_path):
    rows = make_rows(40)
    rows[3]["text"], rows[4]["text"], rows[5]["text"], rows[6]["text"] = "NA", "None", "null", "N/A"
    path = write_rows_csv(tmp_path / "d.csv", rows)
    ds = load_choice(choice(path, validation_fraction=0.25))
    texts = set(ds["train"]["text"]) | set(ds["validation"]["text"])
    assert {"NA", "None", "null", "N/A"} <= texts


def test_whitespace_only_text_is_rejected_like_an_empty_one(tmp_path):
    rows = make_rows(40)
    rows[7]["text"], rows[9]["text"] = "   ", "\t"
    path = write_rows_csv(tmp_path / "d.csv", rows)
    error = expect(path, r"text column 'text' has 2 value\(s\) with no text in split 'train'")
    assert "whitespace-only" in error.message and "row(s) 7, 9" in error.message
    assert "filter" in error.fix


def test_blank_text_cell_is_reported_as_missing(tmp_path):
    path = write_rows_csv(tmp_path / "d.csv", make_rows(20), ",positive\n")
    error = expect(path, "1 value\\(s\\) with no text")
    assert "1 missing" in error.message


def test_check_texts_on_a_dataset_passed_directly():
    from datasets import Dataset

    from workbench.sources.data_checks import check_texts

    ds = Dataset.from_dict({"text": ["fine", "  \n", "also fine"], "label": [0, 1, 0]})
    with pytest.raises(DataError, match="row\\(s\\) 1,"):
        check_texts(ds, ["text"], "validation")
    check_texts(ds.select([0, 2]), ["text"])  # a view without the blank row is fine


def test_na_in_a_csv_label_column_is_a_missing_label_named_as_written(tmp_path):
    path = write_rows_csv(tmp_path / "d.csv", make_rows(20), "a film,NA\nanother film,NA\n")
    error = expect(path, "label column 'label' has 2 empty value\\(s\\) in split 'train' \\(2 written as 'NA'\\)")
    assert "really is a class" in error.fix


# ---------------------------------------------------------------- local path or hub id (issue 11)


def test_a_missing_path_like_string_is_file_not_found_not_the_hub(tmp_path, monkeypatch):
    from workbench.sources.data import resolve_data_source

    monkeypatch.chdir(tmp_path)
    write_csv(tmp_path / "data" / "train.csv", 10)
    for text in ("data/trian.csv", "path/that/does/not/exist.csv", "./nope", "~/nope/x", "my data.csv"):
        with pytest.raises(DataError, match="file not found") as info:
            resolve_data_source(text)
        assert text.lstrip("./~") in info.value.message and "hub" not in info.value.message
    with pytest.raises(DataError) as info:
        resolve_data_source("data/trian.csv")
    assert "train.csv" in info.value.message  # what is there, to spot the typo
    assert resolve_data_source("data/train.csv") == "files"
    assert resolve_data_source("data") == "files"
    for hub_id in ("stanfordnlp/sst2", "imdb", "glue"):
        assert resolve_data_source(hub_id) == "hub"


def test_a_path_given_as_a_hub_choice_says_file_not_found(tmp_path):
    from workbench.sources.data import load_raw

    missing = tmp_path / "path" / "that" / "does" / "not" / "exist.csv"
    with pytest.raises(DataError, match="file not found") as info:
        load_raw(DatasetChoice(source="hub", path=str(missing)))
    assert str(missing) in info.value.message and "offline" not in str(info.value)


def test_fit_with_a_missing_csv_path_says_file_not_found(tiny_bert, tmp_path):
    import workbench

    with pytest.raises(DataError, match="file not found: path/that/does/not/exist.csv") as info:
        workbench.fit(str(tiny_bert), "path/that/does/not/exist.csv", output_dir=str(tmp_path / "out"),
                      progress="none")
    assert "offline" not in str(info.value)


# ---------------------------------------------------------------- delimiter vs extension (issue 11)


def test_tsv_named_csv_says_rename_it(tmp_path):
    rows = make_rows(30)
    rows[13]["text"] = "slow, but moving"  # pandas: "Expected 1 fields in line 15, saw 2"
    path = tmp_path / "reviews.csv"
    path.write_text("text\tlabel\n" + "".join(f"{r['text']}\t{r['label']}\n" for r in rows), encoding="utf-8")
    error = expect(path, "looks tab-separated")
    assert "reviews.tsv" in error.fix and "rename" in error.fix
    path.rename(tmp_path / "reviews.tsv")  # and the advice works
    ds = load_choice(choice(tmp_path / "reviews.tsv"))
    assert ds["train"].num_rows + ds["validation"].num_rows == 30


def test_csv_named_tsv_and_semicolon_csv(tmp_path):
    path = write_csv(tmp_path / "d.csv", 20)
    path.rename(tmp_path / "d.tsv")
    error = expect(tmp_path / "d.tsv", "looks comma-separated")
    assert "d.csv" in error.fix
    semi = tmp_path / "excel.csv"
    semi.write_text("text;label\n" + "".join(f"{r['text'].replace(',', '')};{r['label']}\n"
                                              for r in make_rows(20)), encoding="utf-8")
    expect(semi, "looks semicolon-separated")


def test_check_texts_is_fast_on_clean_views_and_names_a_non_text_column():
    import time

    from datasets import Dataset

    from workbench.sources.data_checks import check_texts

    big = Dataset.from_dict({"text": ["a few words"] * 300_000, "label": [0, 1] * 150_000}).shuffle(seed=0)
    started = time.perf_counter()
    check_texts(big, ["text"])
    assert time.perf_counter() - started < 2.0  # the whole-table pass; no per-row Python
    with pytest.raises(DataError, match="holds int64, not text"):
        check_texts(Dataset.from_dict({"text": [1, 2], "label": [0, 1]}), ["text"])
    with pytest.raises(DataError, match=r"2 value\(s\) with no text .*\(2 missing;"):
        check_texts(Dataset.from_dict({"text": [None, None], "label": [0, 1]}), ["text"])


# -- check_split: the one owner of the data checks (loading and fit use it) --------------
def test_missing_column_names_available_columns():
    from datasets import Dataset

    ds = Dataset.from_dict({"sentence": ["a"], "label": [0]})
    with pytest.raises(DataError, match="column 'text' is not in split 'train'; available columns: sentence, label"):
        data_checks.check_split(ds, "train", ("text",), "label")


def test_empty_split_is_an_error():
    from datasets import Dataset

    ds = Dataset.from_dict({"text": [], "label": []})
    with pytest.raises(DataError, match="empty"):
        data_checks.check_split(ds, "train", ("text",), "label")
