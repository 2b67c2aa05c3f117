import json

import pytest

from workbench.config import DatasetChoice, RunSpec, TrainConfig
from workbench.errors import ConfigError


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("batch_size", 0, "a positive int"),
        ("precision", "fp8", "auto | fp32 | fp16 | bf16"),
        ("scheduler", "step", "linear | cosine | constant"),
        ("learning_rate", -1.0, "a positive float"),
        ("best_metric", "bleu", "(for task auto)"),
        ("warmup_ratio", 1.5, "[0, 1)"),
        ("num_workers", -1, "non-negative"),
        ("eval_before_training", "yes", "true or false"),
    ],
)
def test_bad_value_names_field_and_allowed(field, value, allowed):
    with pytest.raises(ConfigError) as err:
        TrainConfig(**{field: value})
    assert err.value.field == field
    assert f"{field}={value!r}" in str(err.value)
    assert allowed in str(err.value)


def test_dataset_choice_accepts_single_column_string():
    assert DatasetChoice(text_columns="text").text_columns == ("text",)
    with pytest.raises(ConfigError, match="data.source"):
        DatasetChoice(source="ftp")


def test_runspec_roundtrip_yaml_and_json(tmp_path):
    spec = RunSpec.from_dict(
        {"model": {"name_or_path": "m"}, "data": {"source": "files", "path": "d.csv", "text_columns": ["text"]},
         "train": {"batch_size": 8, "precision": "bf16"}}
    )
    for name in ("spec.yaml", "spec.json"):
        path = spec.save(tmp_path / name)
        again = RunSpec.load(path)
        assert again == spec
    assert json.loads((tmp_path / "spec.json").read_text())["train"]["batch_size"] == 8


def test_runspec_unknown_key_is_named(tmp_path):
    with pytest.raises(ConfigError, match="train.lr"):
        RunSpec.from_dict({"train": {"lr": 1e-3}})


# ------------------------------------------------------------ parameter files (issue 11)
GOOD = """\
model:
  name_or_path: bert-base-uncased
data:
  source: files
  path: data/train.csv
  text_columns: [text]
train:
  batch_size: 16
  learning_rate: 2e-5
"""


def _load_error(tmp_path, text, name="run.yaml"):
    from workbench.errors import ConfigFileError

    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        RunSpec.load(path)
    assert isinstance(err.value, ConfigFileError) and err.value.fix
    assert str(path) in str(err.value)
    return err.value


def test_yaml_syntax_error_names_file_line_and_what_was_expected(tmp_path):
    bad_indent = GOOD.replace("  learning_rate", "   learning_rate")  # one space too many, line 9
    error = _load_error(tmp_path, bad_indent)
    assert error.line == 9 and ", line 9:" in str(error)
    assert "mapping values are not allowed here" in error.message
    assert "   learning_rate: 2e-5" in error.message  # the line itself, with a caret under the spot
    assert "indent" in error.fix

    error = _load_error(tmp_path, GOOD.replace("  batch_size", "\tbatch_size"))
    assert error.line == 8 and "spaces, not tabs" in error.fix

    error = _load_error(tmp_path, GOOD.replace("[text]", "[text"))
    assert "expected ',' or ']'" in error.message and "starts at line 6" in error.message


def test_section_that_is_not_a_mapping_is_named_with_its_line(tmp_path):
    error = _load_error(tmp_path, GOOD.replace("  batch_size: 16\n", "  - batch_size: 16\n")
                        .replace("  learning_rate: 2e-5\n", ""))
    assert error.field == "train" and error.line == 7
    assert "train=[{'batch_size': 16}] is not valid" in error.message
    assert "a mapping of field: value pairs" in error.message
    error = _load_error(tmp_path, "model: bert-base-uncased\n")
    assert error.field == "model" and error.line == 1
    assert "name_or_path: bert-base-uncased" in error.message  # shows the shape it wants


def test_bad_value_and_unknown_field_get_their_line(tmp_path):
    error = _load_error(tmp_path, GOOD.replace("batch_size: 16", "batch_size: 0"))
    assert error.field == "batch_size" and error.line == 8 and "a positive int" in error.message
    error = _load_error(tmp_path, GOOD.replace("learning_rate", "lr"))
    assert error.field == "train.lr" and error.line == 9


def test_json_syntax_error_and_top_level_list(tmp_path):
    error = _load_error(tmp_path, '{"train": {"batch_size": 8,}}', name="run.json")
    assert error.line == 1 and "not valid JSON" in error.message
    error = _load_error(tmp_path, "- model\n- data\n")
    assert "sections model, data, train" in error.message


def test_from_dict_section_not_a_mapping():
    with pytest.raises(ConfigError, match="a mapping of field: value pairs") as err:
        RunSpec.from_dict({"train": ["batch_size", 16]})
    assert err.value.field == "train"


def test_yaml_reads_exponent_floats_as_numbers(tmp_path):
    # PyYAML (YAML 1.1) reads "2e-5" as a string; the learning rate everyone writes must work.
    path = tmp_path / "run.yaml"
    path.write_text(GOOD, encoding="utf-8")
    spec = RunSpec.load(path)
    assert spec.train.learning_rate == 2e-5 and spec.train.batch_size == 16


def test_train_cli_reports_a_broken_config_without_a_traceback(tmp_path, capsys):
    from workbench.cli import main

    path = tmp_path / "run.yaml"
    path.write_text(GOOD.replace("  learning_rate", "   learning_rate"), encoding="utf-8")
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"workbench train: error: {path}, line 9: not valid YAML" in err and "Traceback" not in err


def test_train_cli_set_reads_exponent_floats(tmp_path):
    import argparse

    from workbench.engine.train_cli import load_spec

    path = tmp_path / "run.yaml"
    path.write_text(GOOD, encoding="utf-8")
    args = argparse.Namespace(config=str(path), set=["train.learning_rate=5e-5"], output_dir=None)
    assert load_spec(args).train.learning_rate == 5e-5


def test_eval_before_training_is_a_yaml_key(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  eval_before_training: true\n  max_steps: 4\n")
    assert RunSpec.load(path).train.eval_before_training is True
    assert TrainConfig().eval_before_training is False
