"""The notebooks as committed: documents with one parameters cell, the contract's names, no outputs.

Executing them is `workbench regress --profile ci`'s job; this checks what a reader and
papermill rely on before any kernel starts.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
TRAINING_PARAMETERS = {
    "model_name": "bert-base-uncased", "dataset_name": "stanfordnlp/sst2", "dataset_config": None,
    "data_files": None, "text_column": "sentence", "label_column": "label",
    "max_train_rows": None, "max_eval_rows": None, "num_epochs": 2, "batch_size": 32,
    "learning_rate": 2e-5, "max_length": 128, "precision": "auto",
}
# The LLM notebook shares the data names; its defaults are an instruct model and chat data.
LLM_PARAMETERS = {
    "model_name": "Qwen/Qwen2.5-0.5B-Instruct", "dataset_name": "HuggingFaceH4/no_robots",
    "dataset_config": None, "data_files": None, "train_split": "train", "eval_split": "test",
    "messages_column": "messages", "finetune": "lora", "loss_on": "completion", "precision": "auto",
}
# 07 evaluates and exports notebook 05's run (and trains one like it when there is none): 05's
# model and data, and a real benchmark task with the harness's own settings.
EVALUATE_PARAMETERS = {
    **LLM_PARAMETERS, "run_dir": "outputs/05_llm_lora", "tasks": ["arc_easy"],
    "include_path": None, "limit": None, "num_fewshot": 0, "apply_chat_template": False, "gguf_type": "q8_0",
}
# The NER/QA notebook: two encoders, two datasets, each with its own recipe (run_ner.py / run_qa.py's).
SPAN_PARAMETERS = {
    "model_name": "bert-base-cased", "ner_dataset": "eriktks/conll2003", "ner_data_files": None,
    "qa_dataset": "rajpurkar/squad", "qa_data_files": None, "max_train_rows": None, "max_eval_rows": None,
    "ner_num_epochs": 3, "qa_num_epochs": 2, "qa_max_length": 384, "doc_stride": 128, "precision": "auto",
}


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _parameters(nb: dict) -> dict:
    cells = [c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", [])]
    assert len(cells) == 1, "exactly one cell must be tagged `parameters`"
    assert cells[0]["cell_type"] == "code"
    values = {}
    for node in ast.parse("".join(cells[0]["source"])).body:
        assert isinstance(node, ast.Assign), "the parameters cell holds assignments only"
        values[node.targets[0].id] = ast.literal_eval(node.value)
    return values


def test_all_ten_notebooks_are_there():
    assert [p.stem[:2] for p in NOTEBOOKS] == ["00", "01", "02", "03", "04", "05", "06", "07", "08", "09"]

# The preference notebook: an instruct (SFT) model, its pretrained base for the playground, and
# TRL's standard preference set; DPO with LoRA at TRL's beta.
PREFERENCE_PARAMETERS = {
    "model_name": "Qwen/Qwen2.5-0.5B-Instruct", "pretrained_model_name": "Qwen/Qwen2.5-0.5B",
    "dataset_name": "trl-lib/ultrafeedback_binarized", "dataset_config": None, "data_files": None,
    "train_split": "train", "eval_split": "test", "preference_loss": "dpo", "beta": 0.1, "finetune": "lora",
    "precision": "auto",
}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_a_clean_document(path):
    nb = _load(path)
    first = nb["cells"][0]
    assert first["cell_type"] == "markdown" and "".join(first["source"]).startswith("# ")
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, "commit without outputs"
    params = _parameters(nb)
    assert params["output_dir"].startswith("outputs")
    if path.stem == "05_llm_lora":
        assert {k: params[k] for k in LLM_PARAMETERS} == LLM_PARAMETERS
        # a real run, capped to minutes on one GPU
        assert params["max_train_rows"] and params["max_eval_rows"] and params["max_steps"] <= 500
    elif path.stem == "07_evaluate_and_ship":
        assert {k: params[k] for k in EVALUATE_PARAMETERS} == EVALUATE_PARAMETERS
    elif path.stem == "08_ner_and_qa":
        assert {k: params[k] for k in SPAN_PARAMETERS} == SPAN_PARAMETERS
    elif path.stem == "09_preference_tuning":
        assert {k: params[k] for k in PREFERENCE_PARAMETERS} == PREFERENCE_PARAMETERS
        assert params["max_train_rows"] and params["max_eval_rows"] and params["max_steps"] <= 500
    elif path.stem != "00_environment_check":
        assert {k: params[k] for k in TRAINING_PARAMETERS} == TRAINING_PARAMETERS
    assert "workbench.record(" in "".join("".join(c["source"]) for c in nb["cells"])


def test_course_solutions_are_folded_and_tagged():
    nb = _load(next(p for p in NOTEBOOKS if p.stem == "02_bert_course"))
    solutions = [c for c in nb["cells"] if "solution" in c["metadata"].get("tags", [])]
    assert len(solutions) == 3
    for cell in solutions:
        assert cell["metadata"]["jupyter"]["source_hidden"] is True
        # a solution fills in only an exercise left empty, so a student's answer survives it
        assert "is None:" in "".join(cell["source"])
