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
        ("best_metric", "bleu", "accuracy | f1 | loss"),
        ("warmup_ratio", 1.5, "[0, 1)"),
        ("num_workers", -1, "non-negative"),
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
