"""workbench.record: what a notebook stores, and reading it back from the .ipynb."""

from __future__ import annotations

import logging

import nbformat
import pytest

from workbench.errors import WorkbenchError
from workbench.notebook_regression.record import MAX_RECORD_BYTES, MIMETYPE, read_records, record


def test_outside_a_kernel_record_logs_and_returns_the_value(caplog):
    with caplog.at_level(logging.INFO, logger="workbench.record"):
        assert record("eval_accuracy", 0.875) == 0.875
        record("eval_loss", float("nan"))
    assert "workbench.record: eval_accuracy = 0.875" in caplog.text
    assert "workbench.record: eval_loss = null" in caplog.text  # NaN is stored as null


def test_numpy_values_become_plain_json(caplog):
    np = pytest.importorskip("numpy")
    with caplog.at_level(logging.INFO, logger="workbench.record"):
        record("acc", np.float32(0.5))
        record("steps", np.int64(7))
        record("per_class", np.array([1, 2]))
        record("summary", {"f1": np.float64(0.25), "ok": np.bool_(True), "bad": np.float64("inf")})
    assert "acc = 0.5" in caplog.text
    assert "steps = 7" in caplog.text
    assert "per_class = [1, 2]" in caplog.text
    assert 'summary = {"f1": 0.25, "ok": true, "bad": null}' in caplog.text


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("", 1, "non-empty string name"),
        (3, 1, "non-empty string name"),
        ("model", object(), "cannot be stored as JSON"),
        ("big", "x" * (MAX_RECORD_BYTES + 1), "records are limited"),
    ],
)
def test_bad_records_say_what_to_do(name, value, expected):
    with pytest.raises(WorkbenchError) as info:
        record(name, value)
    assert expected in str(info.value) and info.value.fix


def test_read_records_takes_the_last_value_of_each_name_and_ignores_other_outputs():
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(
                outputs=[
                    nbformat.v4.new_output("stream", name="stdout", text="hello\n"),
                    nbformat.v4.new_output(
                        "display_data", data={MIMETYPE: {"name": "acc", "value": 0.5}}
                    ),
                ]
            ),
            nbformat.v4.new_markdown_cell("# text"),
            nbformat.v4.new_code_cell(
                outputs=[
                    nbformat.v4.new_output(
                        "display_data",
                        data={MIMETYPE: {"name": "acc", "value": 0.75}, "text/plain": "acc"},
                    ),
                    nbformat.v4.new_output("display_data", data={"text/plain": "not a record"}),
                ]
            ),
        ]
    )
    assert read_records(nb) == {"acc": 0.75}


def test_record_in_a_real_kernel_is_a_display_output_that_reads_back(tmp_path):
    """One real kernel: the bundle has the custom type and a plain-text line for JupyterLab."""
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(
                "from workbench import record\n"
                "record('eval_accuracy', 0.91)\n"
                "record('labels', ['negative', 'positive'])\n"
                "x = record('nan', float('nan'))"
            )
        ]
    )
    NotebookClient(nb, kernel_name="python3", timeout=60, startup_timeout=120).execute()
    outputs = nb.cells[0].outputs
    assert [o.output_type for o in outputs] == ["display_data"] * 3
    assert outputs[0].data[MIMETYPE] == {"name": "eval_accuracy", "value": 0.91}
    assert outputs[0].data["text/plain"] == "workbench.record: eval_accuracy = 0.91"
    path = tmp_path / "executed.ipynb"
    nbformat.write(nb, path)
    assert read_records(path) == {
        "eval_accuracy": 0.91,
        "labels": ["negative", "positive"],
        "nan": None,
    }
