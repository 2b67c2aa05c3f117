"""Token classification: sub-word alignment and tag schemes against hand-made cases, seqeval
scores, bad data named by file and line, and a MiniLM run reloaded with pipeline."""

from __future__ import annotations

import json

import pytest
import torch
from datasets import ClassLabel, Dataset, DatasetDict, Features, List, Value
from span_fixtures import CONLL_SENTENCES, write

from workbench.errors import DataError
from workbench.frontend import fit
from workbench.tasks import token_classification_data as data
from workbench.tasks.metrics import entity_metrics


@pytest.fixture(autouse=True)
def _few_threads():
    torch.set_num_threads(2)


# ------------------------------------------------------------------- alignment
@pytest.fixture(scope="module")
def minilm_tokenizer(minilm):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm)


def test_a_word_in_three_pieces_first_and_all(minilm_tokenizer):
    words, tags = ["EU", "unaffable", "lamb"], ["B-ORG", "B-MISC", "O"]
    encoded = minilm_tokenizer(words, is_split_into_words=True)
    assert minilm_tokenizer.convert_ids_to_tokens(encoded["input_ids"]) == [
        "[CLS]", "eu", "una", "##ffa", "##ble", "lamb", "[SEP]"]
    names = ["O", "B-MISC", "I-MISC", "B-ORG", "I-ORG"]
    ids = {n: i for i, n in enumerate(names)}
    labels, first = data.align_labels(encoded.word_ids(), tags, ids, "IOB2", "first")
    assert [names[x] if x >= 0 else None for x in labels] == [None, "B-ORG", "B-MISC", None, None, "O", None]
    assert first == [1, 2, 5]  # where each word's prediction is read
    labels, _ = data.align_labels(encoded.word_ids(), tags, ids, "IOB2", "all")
    assert [names[x] if x >= 0 else None for x in labels] == [None, "B-ORG", "B-MISC", "I-MISC", "I-MISC", "O", None]


def test_all_subwords_continue_iobes_entities():
    assert data.subword_tags("S-PER", 3, "IOBES", "all") == ["B-PER", "I-PER", "E-PER"]
    assert data.subword_tags("E-PER", 3, "IOBES", "all") == ["I-PER", "I-PER", "E-PER"]
    assert data.subword_tags("B-PER", 2, "IOBES", "all") == ["B-PER", "I-PER"]
    assert data.subword_tags("I-LOC", 2, "IOB1", "all") == ["I-LOC", "I-LOC"]
    assert data.subword_tags("O", 2, "IOB2", "first") == ["O", None]
    mapping = data.build_mapping([["S-PER", "O"]], None, "IOBES", "all")
    assert mapping.names == ["O", "B-PER", "I-PER", "E-PER", "S-PER"]  # what later pieces need is added


def _places(*sequences):
    return [(tags, lambda k, r=r: f"row {r} word {k + 1}") for r, tags in enumerate(sequences)]


def test_tag_schemes_and_their_mixes():
    assert data.find_scheme(_places(["B-PER", "I-PER", "O", "B-LOC"])) == "IOB2"
    assert data.find_scheme(_places(["I-PER", "I-PER", "B-PER", "O", "I-LOC"])) == "IOB1"
    assert data.find_scheme(_places(["S-PER", "O", "B-LOC", "E-LOC"])) == "IOBES"
    with pytest.raises(DataError, match=r"starts with I- \(IOB1\) at row 1 word 2 .* B- after O \(IOB2\) at row 0 "
                                        r"word 1"):
        data.find_scheme(_places(["B-PER", "O"], ["O", "I-LOC"]))
    with pytest.raises(DataError, match=r"E-/S- tags \(IOBES\) at row 0 word 1 and an entity that ends with B- or "
                                        r"I- .* at row 1 word 1") as info:
        data.find_scheme(_places(["S-PER"], ["B-LOC", "O"]))
    assert "IOB2" in info.value.fix


def test_entity_scores_by_hand():
    scores = entity_metrics([["B-PER", "I-PER", "O", "B-LOC"]], [["B-PER", "I-PER", "O", "B-ORG"]])
    assert scores["eval_precision"] == 0.5 and scores["eval_recall"] == 0.5 and scores["eval_f1"] == 0.5
    assert scores["eval_accuracy"] == 0.75
    assert scores["eval_PER_f1"] == 1.0 and scores["eval_LOC_recall"] == 0.0 and scores["eval_LOC_number"] == 1
    assert scores["eval_ORG_precision"] == 0.0 and scores["eval_ORG_number"] == 0
    errors = data.entity_errors(["Peter", "Blackburn", "in", "Brussels", "today"],
                                ["B-PER", "I-PER", "O", "B-LOC", "O"], ["B-PER", "O", "O", "B-ORG", "B-LOC"])
    assert [(e["entity"], e["error"]) for e in errors] == [
        ("Peter Blackburn", "wrong boundary"), ("Brussels", "wrong type"), ("today", "spurious")]


# ------------------------------------------------------------- bad data, up front
def _fit(model, data, out, **settings):
    return fit(str(model), data, output_dir=str(out), progress="none", num_workers=0, max_steps=1,
               batch_size=8, max_length=64, **settings)


def test_words_and_tags_of_different_lengths_name_the_line(tiny_span_bert, tmp_path):
    rows = [{"tokens": ["Rome", "is", "old"], "ner_tags": ["B-LOC", "O", "O"]},
            {"tokens": ["Anna", "met", "Bruno"], "ner_tags": ["B-PER", "O"]}]
    write(tmp_path / "data" / "train.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    write(tmp_path / "data" / "validation.jsonl", json.dumps(rows[0]) + "\n")
    with pytest.raises(DataError, match=r"train.jsonl line 2: 3 words but 2 tags"):
        _fit(tiny_span_bert, tmp_path / "data", tmp_path / "run")
    assert not (tmp_path / "run" / "events.jsonl").exists()


def test_unknown_and_unreadable_tags_name_the_conll_line(tiny_span_bert, tmp_path):
    folder = tmp_path / "conll"
    write(folder / "train.conll", CONLL_SENTENCES)
    write(folder / "validation.conll", "Paris NNP B-NP B-LOC\nMarathon NNP I-NP B-EVENT\n")
    with pytest.raises(DataError, match=r"validation.conll line 2: 'B-EVENT'") as info:
        _fit(tiny_span_bert, folder, tmp_path / "run")
    assert "B-LOC" in info.value.fix  # train's tags are listed
    write(folder / "validation.conll", "Paris NNP B-NP LOCATION\n")
    with pytest.raises(DataError, match=r"validation.conll line 1 \('Paris'\): tag 'LOCATION' is not O or B-/I-/E-"):
        _fit(tiny_span_bert, folder, tmp_path / "run")
    write(folder / "validation.conll", "Paris NNP B-NP I-LOC\nis VBZ B-VP O\n")  # IOB1 beside IOB2 train
    with pytest.raises(DataError, match=r"IOB1\) at \S*validation.conll line 1 .*IOB2\) at \S*train.conll line 3"):
        _fit(tiny_span_bert, folder, tmp_path / "run")


def test_integer_tags_need_names(tiny_span_bert, tmp_path):
    features = Features({"tokens": List(Value("string")), "ner_tags": List(ClassLabel(names=["O", "B-PER", "I-PER"]))})
    good = Dataset.from_dict({"tokens": [["Anna", "Berg", "sang"]], "ner_tags": [[1, 2, 0]]}, features=features)
    plain = Dataset.from_dict({"tokens": [["Anna", "sang"]], "ner_tags": [[7, 0]]})  # ints without names
    with pytest.raises(DataError, match=r"validation split row 0 word 1 \('Anna'\): tag 7 is an integer without"):
        _fit(tiny_span_bert, DatasetDict(train=good, validation=plain), tmp_path / "run")


# ---------------------------------------------------------------------- training
def test_minilm_learns_entities_and_reloads_with_the_pipeline(minilm, ner_folder, tmp_path):
    """task picked from the CoNLL files; 18 steps of MiniLM learn the generated entities."""
    out = tmp_path / "run"
    result = fit(str(minilm), str(ner_folder), output_dir=str(out), progress="none", num_workers=0,
                 num_epochs=3, batch_size=16, learning_rate=5e-4, max_length=48, warmup_ratio=0.1)
    assert result.status == "completed"
    start = json.loads((out / "events.jsonl").read_text().splitlines()[0])
    assert start["config"]["task"] == "token_classification"
    assert result.label_names[:3] == ["O", "B-LOC", "I-LOC"]
    metrics = result.metrics
    assert metrics["eval_f1"] > 0.6, metrics  # a misaligned label would stay near 0
    assert {"eval_precision", "eval_recall", "eval_accuracy", "eval_PER_f1", "eval_LOC_number"} <= set(metrics)
    best = json.loads((out / "best" / "best.json").read_text())
    assert best["metrics"]["eval_f1"] == max(e["eval_f1"] for e in result.history if e["kind"] == "eval")

    saved = [json.loads(line) for line in (result.model_dir / "eval_predictions.jsonl").read_text().splitlines()]
    assert len(saved) == 24 and set(saved[0]) == {"words", "gold", "predicted"}

    from transformers import pipeline

    from workbench.widgets.span_views import EntityPlayground

    found = pipeline("token-classification", model=str(result.model_dir), aggregation_strategy="simple",
                     device="cpu")("Angela Merkel visited Paris on Monday .")
    assert [(e["entity_group"], e["word"]) for e in found] == [("PER", "angela merkel"), ("LOC", "paris")]
    playground = EntityPlayground(result.model_dir, device="cpu")
    assert [e["entity_group"] for e in playground.run("Greta Thunberg met officials of Siemens in Tokyo .")] == [
        "PER", "ORG", "LOC"]
    assert playground.output.value.count("<mark class='wb-entity'") == 3

    from workbench.engine.runs import read_run

    run = read_run(out)
    assert run.best_metric == "eval_f1" and run.best_value == best["metrics"]["eval_f1"]
