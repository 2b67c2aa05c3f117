"""The pickers as Python objects (no browser): choices, messages, export."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest

from workbench.config import RunSpec, TrainConfig
from workbench.sources.synthetic import write_csv
from workbench.widgets.pickers import DatasetPicker, ModelPicker, papermill_command, pickers

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture()
def models_dir(tiny_bert, tmp_path, monkeypatch):
    root = tmp_path / "models"
    shutil.copytree(tiny_bert, root / "tiny-bert")
    monkeypatch.setenv("WORKBENCH_MODELS", str(root))
    return root


@pytest.fixture()
def data_dir(tmp_path):
    folder = tmp_path / "data"
    write_csv(folder / "train.csv", 80)
    write_csv(folder / "validation.csv", 20, seed=1)
    return folder


# ---------------------------------------------------------------- model picker


def test_model_picker_lists_and_selects(models_dir):
    picker = ModelPicker()
    values = [v for _, v in picker.found.options]
    assert str(models_dir / "tiny-bert") in values
    picker.found.value = str(models_dir / "tiny-bert")  # what a click does
    assert picker.info is not None and picker.info.hidden_size == 32
    assert picker.model_choice.name_or_path == str(models_dir / "tiny-bert")
    assert "BertForSequenceClassification" in picker.details.value
    assert picker.seq_len == 128  # clamped to the model's max positions
    assert "No GPU" in picker.estimate.value
    assert picker.message.value == ""


def test_model_picker_estimate_follows_settings(models_dir):
    picker = ModelPicker(free_bytes=300 * 2**20)
    picker.typed.value = str(models_dir / "tiny-bert")
    first = picker.fit.estimate
    picker.batch_box.value = 64  # the widget, as the mouse would
    assert picker.batch_size == 64 and picker.fit.estimate.batch_size == 64
    assert picker.fit.estimate.activations_bytes > first.activations_bytes
    picker.precision = "bf16"  # the trait, as code would
    assert picker.precision_box.value == "bf16" and picker.fit.estimate.precision == "bf16"
    # 300 MiB is less than the CUDA context alone: will not fit, options are priced
    assert picker.fit.fits is False and "Will not fit" in picker.estimate.value


def test_model_selected_from_code_shows_in_the_widgets(models_dir, tmp_path):
    picker = ModelPicker()
    picker.typed.value = "some/typed-id"
    picker.select(str(models_dir / "tiny-bert"))  # listed: the dropdown shows it
    assert picker.found.value == str(models_dir / "tiny-bert") and picker.typed.value == ""
    picker.select(str(tmp_path))  # not listed: the text box shows it
    assert picker.found.value == "" and picker.typed.value == str(tmp_path)
    assert picker.name_or_path == str(tmp_path)


def test_offline_hub_id_lands_in_message(models_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    picker = ModelPicker()
    picker.typed.value = "google-bert/bert-base-uncased"
    assert picker.info is None
    assert "hub is offline" in picker.message.value
    assert "What to do" in picker.message.value
    assert "Traceback" not in picker.message.value


def test_folder_that_is_not_a_model_lands_in_message(tmp_path, models_dir):
    picker = ModelPicker()
    picker.select(str(tmp_path))
    assert picker.info is None and "not a model folder" in picker.message.value
    with pytest.raises(Exception, match="no model"):
        ModelPicker().model_choice  # noqa: B018 - nothing chosen yet


# ---------------------------------------------------------------- dataset picker


def test_dataset_picker_loads_and_suggests(data_dir):
    picker = DatasetPicker()
    picker.path_box.value = str(data_dir)
    picker.load_button.click()
    assert picker.message.value == ""
    assert picker.text_columns == ("text",) and picker.label_column == "label"
    assert picker.eval_split == "validation"
    assert "train 80" in picker.splits_info.value and "validation 20" in picker.splits_info.value
    assert "<table" in picker.preview.value and "string" in picker.preview.value
    assert picker.chart.value[:4] == b"\x89PNG"
    choice = picker.dataset_choice
    assert (choice.source, choice.path, choice.eval_split) == ("files", str(data_dir), "validation")
    picker.check_button.click()
    assert "negative 40, positive 40" in picker.distribution.value
    assert picker.checked["validation"].num_rows == 20


def test_dataset_picker_stratified_split_choice(data_dir):
    picker = DatasetPicker()
    picker.path = str(data_dir / "train.csv")  # the trait; the text box follows
    assert picker.path_box.value == str(data_dir / "train.csv")
    assert picker.load()
    assert picker.eval_split == "" and not picker.fraction_box.disabled
    picker.fraction_box.value = 0.25
    picker.seed_box.value = 3
    choice = picker.dataset_choice
    assert (choice.eval_split, choice.validation_fraction, choice.seed) == (None, 0.25, 3)
    assert picker.check()
    assert picker.checked["validation"].num_rows == 20
    assert "stratified 25%" in picker.distribution.value


def test_dataset_picker_errors_land_in_message(tmp_path, data_dir):
    picker = DatasetPicker()
    picker.path = str(tmp_path / "missing.csv")
    assert picker.load() is False
    assert "does not exist" in picker.message.value and picker.raw is None

    bad = tmp_path / "latin.csv"
    bad.write_bytes(b"text,label\n" + "caf\u00e9,x\n".encode("latin-1"))
    picker.path = str(bad)
    picker.load_button.click()
    assert "not UTF-8" in picker.message.value and "byte 14" in picker.message.value

    picker.path = str(data_dir)
    assert picker.load()
    picker.label_column = "sentiment"  # a column that is not there (e.g. set from code)
    assert picker.check() is False
    assert "available columns: text, label" in picker.message.value


def test_dataset_picker_without_obvious_names(tmp_path):
    path = tmp_path / "odd.csv"
    path.write_text("a,b\nhello,x\nworld,y\n", encoding="utf-8")
    picker = DatasetPicker()
    picker.path = str(path)
    assert picker.load()
    assert picker.text_columns == () and "Choose the text column" in picker.message.value
    picker.text_box.value = ("a",)
    picker.label_box.value = "b"
    assert picker.dataset_choice.text_columns == ("a",) and picker.dataset_choice.label_column == "b"


# ---------------------------------------------------------------- export


def test_export_round_trips_and_prints_commands(models_dir, data_dir, tmp_path):
    both = pickers()
    both.model.select(str(models_dir / "tiny-bert"))
    both.model.batch_size = 8
    both.dataset.path = str(data_dir)
    assert both.dataset.load()
    both.output_dir.value = str(tmp_path / "run")
    target = both.export(str(tmp_path / "spec.yaml"), train=TrainConfig(num_epochs=1))
    assert target is not None, both.message.value
    loaded = RunSpec.load(target)
    assert loaded == both.run_spec(TrainConfig(num_epochs=1))
    assert loaded.model.name_or_path == str(models_dir / "tiny-bert")
    assert loaded.data.text_columns == ("text",) and loaded.data.eval_split == "validation"
    assert (loaded.train.batch_size, loaded.train.max_length, loaded.train.num_epochs) == (8, 128, 1)
    assert f"workbench train --config {target}" in both.commands.value
    line = papermill_command(loaded)
    args = shlex.split(line)
    params = dict(zip(args[4::3], args[5::3], strict=True))
    assert args[:2] == ["papermill", "notebooks/01_quickstart.ipynb"]
    assert params["model_name"] == str(models_dir / "tiny-bert")
    assert params["data_files"] == str(data_dir)
    assert (params["text_column"], params["label_column"], params["batch_size"]) == ("text", "label", "8")
    json_target = both.export(str(tmp_path / "spec.json"))
    assert json.loads(json_target.read_text())["data"]["path"] == str(data_dir)


def test_export_without_choices_lands_in_message(tmp_path):
    both = pickers()
    assert both.export(str(tmp_path / "x.yaml")) is None
    assert "no model is selected" in both.message.value
    assert not (tmp_path / "x.yaml").exists()


def test_papermill_command_for_hub_dataset():
    spec = RunSpec.from_dict({"data": {"source": "hub", "path": "nyu-mll/glue", "config_name": "mrpc",
                                       "text_columns": ["sentence1", "sentence2"]}})
    line = papermill_command(spec)
    assert "-p dataset_name nyu-mll/glue -p dataset_config mrpc" in line
    assert "-p text_column sentence1" in line and "sentence pairs" in line


# ---------------------------------------------------------------- columns chosen from code (issue 11)


def test_select_columns_names_a_missing_column_and_lists_the_ones_there_are(data_dir):
    from workbench.errors import DataError

    picker = DatasetPicker()
    picker.path = str(data_dir)
    assert picker.load()
    with pytest.raises(DataError) as err:
        picker.select_columns(("sentence",), "label")  # the SST-2 default on a CSV with "text"
    assert "column 'sentence' is not in" in err.value.message
    assert "its columns are: text, label" in err.value.message
    assert "text_column" in err.value.fix
    assert "sentence" in picker.message.value  # shown in the picker too
    assert picker.text_box.value == ("text",) and picker.text_columns == ("text",)  # nothing half-set

    with pytest.raises(DataError, match="columns 'review', 'stars' are not in"):
        picker.select_columns("review", "stars")

    picker.select_columns("text", "label")
    assert picker.text_box.value == ("text",) and picker.label_box.value == "label"
    assert picker.dataset_choice.text_columns == ("text",)


def test_select_columns_before_load_only_stores_the_choice():
    picker = DatasetPicker()
    picker.select_columns(["a", "b"], "y")
    assert picker.text_columns == ("a", "b") and picker.label_column == "y"


def test_quickstart_picker_cell_with_a_wrong_text_column(tiny_bert, data_dir):
    """The quickstart's own cell, run with text_column="sentense": a DataError, not a TraitError."""
    from workbench import DatasetChoice, ModelChoice
    from workbench.errors import DataError

    cells = json.loads((REPO / "notebooks" / "01_quickstart.ipynb").read_text())["cells"]
    source = next("".join(c["source"]) for c in cells
                  if c["cell_type"] == "code" and "picker = workbench.pickers(" in "".join(c["source"]))
    namespace = dict(
        model_choice=ModelChoice(str(tiny_bert)), output_dir="unused", num_epochs=1, batch_size=8,
        learning_rate=1e-3, max_length=64, precision="fp32",
        dataset_choice=DatasetChoice(source="files", path=str(data_dir), text_columns=("sentense",)))
    with pytest.raises(DataError, match="column 'sentense' is not in .*its columns are: text, label"):
        exec(compile(source, "01_quickstart.ipynb", "exec"), namespace)
    # With the right name the cell fills the widgets and the choice the run will use.
    namespace["dataset_choice"] = DatasetChoice(source="files", path=str(data_dir), text_columns=("text",))
    exec(compile(source, "01_quickstart.ipynb", "exec"), namespace)
    picker = namespace["picker"]
    assert picker.dataset.text_box.value == ("text",) and picker.dataset.label_box.value == "label"
    assert picker.dataset_choice.text_columns == ("text",)
