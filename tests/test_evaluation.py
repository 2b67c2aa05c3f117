"""``workbench.evaluate`` on lm-evaluation-harness: local tasks, the run's held-out task, base vs tuned,
results in the run folder, the runs table and the card, classifier reports, and the offline refusals.

Models are the tiny Llama (SmolLM2's tokenizer and template) and the session's LoRA run on it
(tests/llm_fixtures.py): the harness's real code paths, with scores that mean nothing. Nothing
here reaches a hub: the offline tests point the dataset caches at empty folders.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import workbench
from workbench.errors import EvaluationError


@pytest.fixture(scope="module")
def local_tasks(tmp_path_factory) -> Path:
    """A folder with one harness task YAML on a local JSONL file (4 ten-way questions)."""
    from workbench.sources.synthetic_llm import write_color_task

    folder = tmp_path_factory.mktemp("tasks")
    write_color_task(folder, 4)
    return folder


@pytest.fixture(scope="module")
def base_vs_tuned(tiny_lora_run, tiny_llama_dir, tmp_path_factory):
    """One call for two models: the base and the run (a copy), on the run's held-out split."""
    run = shutil.copytree(tiny_lora_run, tmp_path_factory.mktemp("eval") / "run",
                          ignore=shutil.ignore_patterns("checkpoints", "tensorboard"))
    events = []
    result = workbench.evaluate({"base": str(tiny_llama_dir), "tuned": str(run)}, ["heldout"], limit=4,
                                progress="none", listeners=[events.append])
    return result, run, events


def test_base_vs_tuned_is_one_table_and_the_runs_results_are_kept(base_vs_tuned):
    result, run, events = base_vs_tuned
    rows = {r["score"]: r for r in result.table()}
    assert set(rows) == {"heldout/acc", "heldout/acc_norm"}
    row = rows["heldout/acc"]
    assert {"base", "base ±", "tuned", "tuned ±", "change"} <= set(row)
    assert row["change"] == pytest.approx(row["tuned"] - row["base"])
    assert result["tuned"].meta["folder"] == "model_merged"  # the up-to-date merged model, not adapter layers
    assert result["tuned"].meta["evaluated"] == str(run / "model_merged")
    assert result["base"].saved is None  # the base is no run: nothing written anywhere
    saved = result["tuned"].saved
    assert saved.parent == run / "evaluation" and saved.name.startswith("results-")
    on_disk = json.loads(saved.read_text())
    assert on_disk["workbench"]["limit"] == 4 and on_disk["workbench"]["apply_chat_template"] is False
    assert on_disk["results"]["heldout"]["acc,none"] == result["tuned"].score("heldout/acc")
    assert on_disk["n-samples"]["heldout"]["effective"] == 4
    # The events: a start and an end per model, progress in between, no bar drawn.
    kinds = [e["kind"] for e in events]
    assert kinds.count("evaluate_start") == 2 and kinds.count("evaluate_end") == 2 and "progress" in kinds
    import lm_eval.models.huggingface as hf
    from tqdm import tqdm

    assert hf.tqdm is tqdm  # the harness's own bars are put back


def test_the_heldout_task_is_the_runs_own_split_as_a_multiple_choice_task(base_vs_tuned):
    _, run, _ = base_vs_tuned
    folder = run / "evaluation" / "tasks" / "heldout"
    import yaml

    config = yaml.safe_load((folder / "heldout.yaml").read_text())
    assert config["output_type"] == "multiple_choice" and config["target_delimiter"] == ""
    rows = [json.loads(line) for line in (folder / "heldout.jsonl").read_text().splitlines()]
    validation = [json.loads(line) for line in (Path(json.loads((run / "run.json").read_text())["data"]["path"])
                                                / "validation.jsonl").read_text().splitlines()]
    assert len(rows) == len(validation)
    first = validation[0]["messages"]
    assert rows[0]["answer"] == first[-1]["content"] and first[0]["content"] in rows[0]["prompt"]
    assert rows[0]["prompt"].endswith("<|im_start|>assistant\n")  # rendered as in training, up to the answer
    assert rows[0]["choices"][rows[0]["label"]] == rows[0]["answer"]


def test_scores_reach_the_runs_table_and_the_model_card(base_vs_tuned):
    result, run, _ = base_vs_tuned
    table = workbench.runs(run.parent, mode="console")
    row = table.rows()[0]
    assert row["heldout/acc"] == pytest.approx(result["tuned"].score("heldout/acc"))
    assert "heldout/acc" in table.format()
    from workbench.widgets.runs import _html_table

    assert "<th>heldout/acc</th>" in _html_table(table.rows(), [])  # the notebook's runs browser shows them too
    text = (run / "model_merged" / "README.md").read_text()
    assert "## Evaluations" in text and "| heldout | acc |" in text
    meta = __import__("yaml").safe_load(text.split("---\n", 2)[1])
    benchmark = [r for r in meta["model-index"][0]["results"] if r["task"].get("name") == "heldout"][0]
    assert benchmark["dataset"]["type"] == "json" and benchmark["dataset"]["split"] == "test"
    assert benchmark["source"]["url"].endswith("lm-evaluation-harness")
    assert "| heldout | acc |" in (run / "model" / "README.md").read_text()  # the adapter's card lists them too


def test_a_broken_results_file_never_breaks_the_runs_table(base_vs_tuned, tmp_path):
    _, run, _ = base_vs_tuned
    copy = shutil.copytree(run, tmp_path / "run", ignore=shutil.ignore_patterns("model*", "best"))
    (copy / "evaluation" / "results-20990101T000000000000Z.json").write_text("{ not json")
    row = workbench.runs(tmp_path, mode="console").rows()[0]
    assert row["status"] == "completed" and "heldout/acc" in row


def test_a_local_task_on_a_model_object_and_a_folder(local_tasks, tiny_llama_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    model.train()
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    result = workbench.evaluate({"object": (model, tokenizer), "folder": str(tiny_llama_dir)}, "colors_mc",
                                include_path=local_tasks, progress="none", dtype="float32")
    assert model.training  # put back as it was given
    # The same weights through both doors: the same score.
    assert result["object"].score("colors_mc/acc") == pytest.approx(result["folder"].score("colors_mc/acc"))
    assert result["object"].meta["evaluated"] == "a model object"
    assert "colors_mc/acc" in str(result) and "<table>" in result._repr_html_()


def test_a_generation_heldout_task_when_the_answers_are_all_different(tiny_lora_run, tmp_path):
    from datasets import Dataset, DatasetDict

    run = shutil.copytree(tiny_lora_run, tmp_path / "run", ignore=shutil.ignore_patterns("checkpoints", "tensorboard"))
    chats = [[{"role": "user", "content": f"Say {word}."}, {"role": "assistant", "content": f"{word}!"}]
             for word in ("apple", "river", "stone")]
    data = DatasetDict(validation=Dataset.from_list([{"messages": m} for m in chats]))
    result = workbench.evaluate(str(run), "heldout", data=data, progress="none")
    import yaml

    config = yaml.safe_load((run / "evaluation" / "tasks" / "heldout" / "heldout.yaml").read_text())
    assert config["output_type"] == "generate_until" and config["generation_kwargs"]["until"] == ["<|im_end|>"]
    assert 0.0 <= result["run"].score("heldout/exact_match") <= 1.0


def test_offline_a_harness_dataset_not_in_the_cache_is_refused_before_any_model_loads(tiny_llama_dir, tmp_path,
                                                                                     monkeypatch):
    import datasets
    import huggingface_hub.constants
    import lm_eval

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the missing dataset was reported")

    monkeypatch.setattr(lm_eval, "simple_evaluate", no_model)
    with pytest.raises(EvaluationError, match="arc_easy needs allenai/ai2_arc") as caught:
        workbench.evaluate(str(tiny_llama_dir), ["arc_easy"], progress="none")
    assert "Nothing was loaded" in str(caught.value) and "include_path" in caught.value.fix
    with pytest.raises(EvaluationError, match="did you mean arc_easy"):
        workbench.evaluate(str(tiny_llama_dir), ["arc_easyy"], progress="none")
    with pytest.raises(EvaluationError, match="not in the local Hugging Face cache"):
        workbench.evaluate("someone/not-a-cached-model", ["arc_easy"], progress="none")


def test_heldout_needs_a_run_and_its_data(tiny_llama_dir, tiny_lora_run, tmp_path):
    with pytest.raises(EvaluationError, match="no model here is a run"):
        workbench.evaluate(str(tiny_llama_dir), "heldout", progress="none")
    run = shutil.copytree(tiny_lora_run, tmp_path / "run", ignore=shutil.ignore_patterns("checkpoints", "tensorboard"))
    record = json.loads((run / "run.json").read_text())
    record["data"] = {"source": "memory", "name": None}
    (run / "run.json").write_text(json.dumps(record))
    with pytest.raises(EvaluationError, match="in-memory dataset") as caught:
        workbench.evaluate(str(run), "heldout", progress="none")
    assert "data=" in caught.value.fix


def test_a_classifier_is_scored_on_a_labelled_file(tiny_bert, sentiment_data, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from workbench.engine.train import fit

    train = sentiment_data["train"].select(range(64))
    small = sentiment_data.__class__({"train": train, "validation": sentiment_data["validation"].select(range(16))})
    out = tmp_path / "runs" / "clf"
    names = fit(str(tiny_bert), small, output_dir=str(out), num_epochs=1, batch_size=16, max_length=32,
                num_workers=0, precision="fp32").label_names
    test_file = tmp_path / "test.csv"
    rows = sentiment_data["validation"].select(range(16, 40))
    test_file.write_text("text,label\n" + "".join(f"\"{r['text']}\",{r['label']}\n" for r in rows))
    result = workbench.evaluate(str(out), data=str(test_file), text_columns="text", label_column="label",
                                progress="none")
    scores = result["clf"]
    assert 0.0 <= scores.score("test/accuracy") <= 1.0 and 0.0 <= scores.score("test/f1") <= 1.0
    matrix = scores.results["confusion_matrix"]
    assert sum(map(sum, matrix)) == 24 and scores.results["labels"] == names
    diagonal = sum(matrix[i][i] for i in range(len(names)))
    assert scores.score("test/accuracy") == pytest.approx(diagonal / 24)
    assert result.plot_confusion_matrix() is not None
    assert workbench.runs(tmp_path / "runs", mode="console").rows()[0]["test/accuracy"] == pytest.approx(diagonal / 24)
    with pytest.raises(EvaluationError, match="is a causal_lm run"):
        from workbench.evaluation.classifier import check_classifier
        from workbench.evaluation.targets import Target

        check_classifier(Target("lm", "run", task="causal_lm"))


def test_the_cli_prints_the_table(local_tasks, tiny_llama_dir, capsys):
    from workbench.cli import main

    assert main(["evaluate", f"tiny={tiny_llama_dir}", "--tasks", "colors_mc", "--include-path", str(local_tasks),
                 "--limit", "2", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "workbench evaluate: [1/1] tiny on colors_mc" in out and "colors_mc/acc" in out and "limit 2" in out


@pytest.mark.skipif(shutil.which("git") is None, reason="the harness's commit probe runs git")
def test_the_harness_commit_probe_says_nothing_outside_a_repository(tmp_path, monkeypatch, capfd):
    """The harness records the working folder's commit with ``git describe`` and lets git's "fatal: not
    a git repository" through to the cell (from /workspace in the image: every evaluation)."""
    import subprocess

    import lm_eval.evaluator

    from workbench.evaluation.progress import quiet_libraries

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # never inside a repository above
    lm_eval.evaluator.get_git_commit_hash()
    assert "not a git repository" in capfd.readouterr().err  # the harness's own probe, as a cell showed it
    with quiet_libraries():
        assert lm_eval.evaluator.get_git_commit_hash() is None
    assert capfd.readouterr().err == ""
    # In a repository it still records the commit, as the harness does.
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    with quiet_libraries():
        assert lm_eval.evaluator.get_git_commit_hash() == head
    assert lm_eval.evaluator.get_git_commit_hash() == head  # the harness's own probe is back, same answer
