"""Label mapping, tokenization without padding, dynamic padding, length-grouped sampling."""

from __future__ import annotations

import pytest
from datasets import ClassLabel, Dataset, Features, Value

from workbench.engine.batching import LengthGroupedBatchSampler
from workbench.errors import DataError
from workbench.tasks.classification_data import build_label_mapping, tokenize


def test_string_labels_are_sorted_and_mapped():
    train = Dataset.from_dict({"text": ["a", "b", "c"], "label": ["pos", "neg", "pos"]})
    mapping = build_label_mapping(train, train, "label")
    assert mapping.names == ["neg", "pos"]
    assert mapping.label2id == {"neg": 0, "pos": 1}
    assert mapping.id2label == {0: "neg", 1: "pos"}


def test_classlabel_names_are_kept():
    features = Features({"text": Value("string"), "label": ClassLabel(names=["bad", "good", "meh"])})
    train = Dataset.from_dict({"text": ["a", "b"], "label": [0, 2]}, features=features)
    mapping = build_label_mapping(train, train, "label")
    assert mapping.names == ["bad", "good", "meh"]
    assert mapping.values == [0, 1, 2]


def test_unknown_eval_label_is_a_clear_error():
    train = Dataset.from_dict({"text": ["a", "b"], "label": ["pos", "neg"]})
    evaluation = Dataset.from_dict({"text": ["a"], "label": ["neutral"]})
    with pytest.raises(DataError, match="never seen in train: 'neutral'"):
        build_label_mapping(train, evaluation, "label")


def test_tokenize_truncates_and_does_not_pad(tiny_bert):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    ds = Dataset.from_dict({"text": ["great", "the film is great " * 40], "label": ["pos", "neg"]})
    mapping = build_label_mapping(ds, ds, "label")
    tokenized = tokenize(ds, tokenizer, ("text",), "label", mapping, max_length=16)
    assert tokenized.lengths[0] < 16  # short row keeps its own length: no padding
    assert tokenized.lengths[1] == 16  # long row truncated
    assert tokenized.labels == [1, 0]


def test_sentence_pairs_keep_token_types(tiny_bert):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    ds = Dataset.from_dict({"a": ["great film"], "b": ["dull plot"], "label": ["x"]})
    mapping = build_label_mapping(Dataset.from_dict({"label": ["x", "y"]}), ds, "label")
    tokenized = tokenize(ds, tokenizer, ("a", "b"), "label", mapping, max_length=32, token_types=True)
    row = tokenized[0]
    assert "token_type_ids" in row and 1 in row["token_type_ids"]


def test_task_collator_pads_each_batch_to_its_own_longest_row():
    from workbench.sources.synthetic import train_tokenizer
    from workbench.tasks.classification import ClassificationTask

    tokenizer = train_tokenizer()
    ds = Dataset.from_dict({"text": ["the film is great", "dull"], "label": ["positive", "negative"]})
    mapping = build_label_mapping(ds, ds, "label")
    rows = tokenize(ds, tokenizer, ("text",), "label", mapping, max_length=64)
    batch = ClassificationTask(("text",), "label").collator(tokenizer)([rows[0], rows[1]])
    long, short = len(rows[0]["input_ids"]), len(rows[1]["input_ids"])
    assert batch["input_ids"].shape == (2, long)  # the batch's longest row, not max_length
    assert batch["input_ids"][1, short:].tolist() == [tokenizer.pad_token_id] * (long - short)
    assert batch["attention_mask"].tolist() == [[1] * long, [1] * short + [0] * (long - short)]
    assert batch["labels"].tolist() == [mapping.value_to_id()["positive"], mapping.value_to_id()["negative"]]


def _padding(lengths, batches):
    return sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in batches)


def test_sampler_is_deterministic_per_epoch_and_covers_every_row():
    lengths = [(i * 37) % 50 + 1 for i in range(203)]
    sampler = LengthGroupedBatchSampler(lengths, 8, seed=3)
    sampler.set_epoch(0)
    first = list(sampler)
    assert first == list(sampler)  # same (seed, epoch): same order
    assert sorted(i for b in first for i in b) == list(range(203))
    assert len(first) == len(sampler) == 26
    sampler.set_epoch(1)
    assert list(sampler) != first  # another epoch: another order
    # The longest row is in the first batch (an OOM shows up at once).
    assert max(lengths) == max(lengths[i] for i in first[0])


def test_length_grouping_cuts_padding():
    lengths = [(i * 37) % 50 + 1 for i in range(400)]
    grouped = list(LengthGroupedBatchSampler(lengths, 8, seed=0, group_by_length=True))
    plain = list(LengthGroupedBatchSampler(lengths, 8, seed=0, group_by_length=False))
    assert _padding(lengths, grouped) < _padding(lengths, plain) / 3


def test_eval_sampler_keeps_every_row_once_without_shuffle():
    lengths = [3, 9, 1, 7, 5]
    batches = list(LengthGroupedBatchSampler(lengths, 2, shuffle=False))
    assert batches == [[1, 3], [4, 0], [2]]
