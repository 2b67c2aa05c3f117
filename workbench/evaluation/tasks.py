"""Which tasks an evaluation runs, checked before any model loads.

Three kinds, all run by lm-evaluation-harness itself:

- **The harness's own tasks** by name (``arc_easy``, ``hellaswag``, ``mmlu_abstract_algebra``...).
  Their datasets come from the Hugging Face Hub; with the hub switched off
  (``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE``) each one is loaded here first, and one that is
  not in the local cache is refused with its dataset's name, before a model is loaded for nothing.
- **Local tasks**: folders of the harness's own task YAMLs (``dataset_path: json`` tasks on your
  files), passed as ``include_path`` as the harness names it; their names then work like the
  harness's.
- **``heldout``**: a task made from the run's own held-out split (the rows it evaluated on while
  training). Each conversation up to its last answer is rendered with the run's chat template (as
  the model saw it in training); the answer is the target. When the answers come from a small
  set (labels such as "positive"/"negative") it is a multiple-choice task (accuracy over the
  choices' likelihoods, cheap and with a standard error); otherwise a generation task scored by
  exact match (greedy, whitespace ignored at the ends). A preference run's held-out pairs are a
  two-way multiple-choice task: the chosen answer against the rejected one (``acc``: how often the
  model finds the chosen one the likelier). The task's YAML and rows are written to
  ``<run>/evaluation/tasks/heldout/``, so the harness reads it like any local task and the
  evaluation can be re-run by hand.
"""

from __future__ import annotations

import difflib
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from workbench.engine.benchmarks import EVALUATION_DIR
from workbench.errors import EvaluationError
from workbench.evaluation.targets import Target
from workbench.shipping.card import read_record

HELDOUT = "heldout"
MAX_CHOICES = 12  # answers from at most this many distinct values make a multiple-choice task
MAX_NEW_TOKENS = 64  # generation budget of the heldout task's answers


@dataclass
class TaskPlan:
    """The names handed to the harness, where local tasks live, and what each task is."""

    names: list[str]
    include_path: list[str] = field(default_factory=list)
    kinds: dict[str, str] = field(default_factory=dict)  # name -> harness | local | heldout
    notes: list[str] = field(default_factory=list)


def _datasets_offline() -> bool:
    from workbench.sources.hub import is_offline

    if is_offline():
        return True
    try:
        import datasets

        return bool(getattr(datasets.config, "HF_HUB_OFFLINE", False) or
                    getattr(datasets.config, "HF_DATASETS_OFFLINE", False))
    except ImportError:
        return False


def task_manager(include_path: list[str], defaults: bool = True):
    """The harness's TaskManager. Indexing its own ~15,000 task YAMLs costs ~15 s on two cores (its
    command line pays it on every call); with ``defaults=False`` only ``include_path`` is read."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include_path or None, include_defaults=defaults)


def plan(tasks, *, include_path=None, targets: list[Target], data=None) -> tuple[TaskPlan, object]:
    """The tasks to run (``heldout`` made here) and the harness's TaskManager that knows them all."""
    if isinstance(tasks, str):
        tasks = [tasks]
    if not tasks:
        raise EvaluationError("No task to evaluate on.", "pass tasks=['arc_easy'] (a harness task), a local task's "
                              "name with include_path=FOLDER, or tasks=['heldout'] (the run's own held-out split).")
    paths = [str(Path(p).expanduser().resolve()) for p in ([include_path] if isinstance(include_path, (str, os.PathLike))
                                                             else list(include_path or []))]
    for p in paths:
        if not Path(p).exists():
            raise EvaluationError(f"include_path {p} does not exist.",
                                  "pass a folder of lm-evaluation-harness task YAML files.")
    result = TaskPlan(names=[], include_path=paths)
    for name in tasks:
        if name == HELDOUT:
            folder = make_heldout_task(targets, data=data)
            result.include_path.append(str(folder))
            result.names.append(HELDOUT)
            result.kinds[HELDOUT] = "heldout"
        elif str(name).endswith((".yaml", ".yml")) and Path(name).is_file():
            result.include_path.append(str(Path(name).resolve().parent))
            result.names.append(_task_name_of(Path(name)))
            result.kinds[result.names[-1]] = "local"
        else:
            result.names.append(str(name))
    # Local tasks alone need no index of the harness's own tasks: read those only when asked for.
    manager = task_manager(result.include_path, defaults=False) if result.include_path else None
    local = set(manager.all_tasks) if manager is not None else set()
    if any(name not in result.kinds and name not in local for name in result.names):
        manager = task_manager(result.include_path)
    for name in result.names:
        if name in result.kinds:
            continue
        if name not in manager.all_tasks:
            close = difflib.get_close_matches(name, manager.all_tasks, n=3)
            raise EvaluationError(f"lm-evaluation-harness knows no task {name!r}"
                                  + (f" (did you mean {', '.join(close)}?)" if close else "") + ".",
                                  "pick a name from `lm_eval ls tasks`, pass include_path=FOLDER for your own task "
                                  "YAMLs, or use tasks=['heldout'] for the run's held-out split.")
        result.kinds[name] = "local" if name in local else "harness"
    hub_tasks = [n for n in result.names if result.kinds[n] == "harness"]
    if hub_tasks and _datasets_offline():
        check_cached(manager, hub_tasks)
    return result, manager


def _task_name_of(path: Path) -> str:
    import yaml

    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise EvaluationError(f"{path} cannot be read as a task YAML ({exc}).", "fix the file.") from None
    name = config.get("task") if isinstance(config, dict) else None
    if not isinstance(name, str):
        raise EvaluationError(f"{path} has no `task:` name.", "give the task a name: `task: my_task`.")
    return name


def check_cached(manager, names: list[str]) -> None:
    """Load each harness task's data now (the hub is off: from the cache only); refuse the missing ones."""
    missing = []
    for name in names:
        try:
            manager.load([name])
        except Exception as exc:  # noqa: BLE001 - datasets' offline errors come in many types
            cfg = getattr(manager.task_index.get(name), "cfg", None) or {}
            dataset = cfg.get("dataset_path") or "its dataset"
            if cfg.get("dataset_name"):
                dataset += f" ({cfg['dataset_name']})"
            missing.append((name, dataset, str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""))
    if missing:
        listed = "; ".join(f"{n} needs {d}" for n, d, _ in missing)
        raise EvaluationError(
            f"The hub is switched off (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE) and these tasks' datasets are not in "
            f"the local cache: {listed} ({missing[0][2]}). Nothing was loaded.",
            "run the evaluation once where the hub is reachable (the datasets are cached then), or evaluate on a "
            "local task: include_path=FOLDER of task YAMLs with `dataset_path: json`, or tasks=['heldout'].")


# ----------------------------------------------------------------------------- heldout
def make_heldout_task(targets: list[Target], *, data=None, max_rows: int | None = None) -> Path:
    """Write the ``heldout`` task of the first run among ``targets`` (the first preference run, if one
    is there: an SFT model compared with its preference-tuned successor is scored on the pairs);
    returns its folder."""
    runs = [t for t in targets if t.run_dir is not None]
    if not runs:
        raise EvaluationError("tasks=['heldout'] is made from a run's held-out split, and no model here is a run.",
                              "evaluate a run folder (its output_dir), or name harness or local tasks.")
    records = [read_record(t.run_dir) for t in runs]
    pairs = [i for i, r in enumerate(records) if (r.get("task") or (r.get("config") or {}).get("task")) == "preference"]
    run, record = runs[pairs[0] if pairs else 0], records[pairs[0] if pairs else 0]
    if pairs:
        return _write_pair_task(run, heldout_pair_rows(run, record, data)[:max_rows or None])
    if (record.get("task") or "causal_lm") != "causal_lm":
        raise EvaluationError(f"The run in {run.run_dir} is a {record.get('task')} run; tasks=['heldout'] is "
                              "for language-model runs.",
                              "for a classifier, pass data=FILE with text_columns/label_column: the report has "
                              "accuracy, F1 and the confusion matrix.")
    rows = heldout_rows(run, record, data)
    if max_rows:
        rows = rows[:max_rows]
    folder = run.run_dir / EVALUATION_DIR / "tasks" / HELDOUT
    folder.mkdir(parents=True, exist_ok=True)
    answers = Counter(r["answer"] for r in rows)
    multiple_choice = 2 <= len(answers) <= MAX_CHOICES and len(answers) < len(rows)
    choices = sorted(answers)
    data_file = folder / f"{HELDOUT}.jsonl"
    with data_file.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({**r, "choices": choices, "label": choices.index(r["answer"])
                                if multiple_choice else None}, ensure_ascii=False) + "\n")
    config = {
        "task": HELDOUT, "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data_file)}}, "test_split": "test",
        "doc_to_text": "{{prompt}}",
        # Written for a person reading the folder; the harness ignores unknown metadata keys.
        "metadata": {"version": 1, "source": f"the held-out split of {run.run_dir}",
                     "prompts": "rendered with the run's chat template, up to the last answer"},
    }
    if multiple_choice:
        config.update({"output_type": "multiple_choice", "doc_to_choice": "{{choices}}", "doc_to_target": "{{label}}",
                       "target_delimiter": "", "metric_list": [
                           {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                           {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}]})
    else:
        config.update({"output_type": "generate_until", "doc_to_target": "{{answer}}", "target_delimiter": "",
                       "generation_kwargs": {"until": rows[0]["stop"] if rows else [], "do_sample": False,
                                             "max_gen_toks": MAX_NEW_TOKENS},
                       "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True,
                                        "regexes_to_ignore": [r"^\s+", r"\s+$"]}]})
    import yaml

    (folder / f"{HELDOUT}.yaml").write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return folder


def heldout_rows(run: Target, record: dict, data=None) -> list[dict]:
    """{prompt, answer, stop} of each held-out conversation, the prompt rendered with the run's template."""
    from transformers import AutoTokenizer

    from workbench.config import TrainConfig
    from workbench.shipping.chat_template import analyse, end_of_turn_id
    from workbench.tasks.causal_lm_data import detect_format, to_messages

    splits = _heldout_split(run, record, data)
    settings = TrainConfig(**{k: v for k, v in (record.get("config") or {}).items()
                              if k in TrainConfig.__dataclass_fields__}) if record.get("config") else \
        TrainConfig(task="causal_lm")
    validation = splits["validation"]
    fmt = detect_format(validation.column_names, settings)
    if fmt == "text":
        raise EvaluationError("The run trained on plain text (a text column): its held-out rows have no answers "
                              "to score.", "evaluate on harness or local tasks instead.")
    tokenizer = AutoTokenizer.from_pretrained(run.model_folder if run.folder_name != "model_merged"
                                              else run.run_dir / "model")
    shape = analyse(tokenizer)
    eot = end_of_turn_id(tokenizer, shape) if shape.ok else tokenizer.eos_token_id
    stop = [tokenizer.convert_ids_to_tokens(int(eot))] if eot is not None else []
    rows = []
    for row in validation:
        messages = to_messages(row, fmt, settings)
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        prompt = tokenizer.apply_chat_template(messages[:last], tokenize=False, add_generation_prompt=True)
        rows.append({"prompt": prompt, "answer": messages[last]["content"].strip(), "stop": stop})
    return rows


def heldout_pair_rows(run: Target, record: dict, data=None) -> list[dict]:
    """{prompt, choices: [chosen, rejected], label: 0} of each held-out pair of a preference run,
    the prompt rendered with the run's chat template (raw text for ``implicit_text`` pairs)."""
    from transformers import AutoTokenizer

    from workbench.config import TrainConfig
    from workbench.tasks.preference_data import detect_pair_format, split_pair

    validation = _heldout_split(run, record, data)["validation"]
    settings = TrainConfig(**{k: v for k, v in (record.get("config") or {}).items()
                              if k in TrainConfig.__dataclass_fields__}) if record.get("config") else \
        TrainConfig(task="preference")
    fmt = detect_pair_format(validation.column_names, validation[0], settings)
    tokenizer = AutoTokenizer.from_pretrained(run.model_folder if run.folder_name != "model_merged"
                                              else run.run_dir / "model")
    rows = []
    for row in validation:
        prompt, chosen, rejected, problem = split_pair(row, fmt, settings)
        if problem:  # refused in training too: not a question to score
            continue
        if fmt != "implicit_text":
            prompt = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
            chosen, rejected = (answer[-1]["content"] for answer in (chosen, rejected))
        rows.append({"prompt": prompt, "choices": [chosen, rejected], "label": 0})
    if not rows:
        raise EvaluationError(f"The held-out split of {run.run_dir} has no pair to score.",
                              "pass data= with a validation split of prompt/chosen/rejected rows.")
    return rows


def _write_pair_task(run: Target, rows: list[dict]) -> Path:
    """The held-out pairs as a two-way multiple-choice task: ``acc`` is the share of pairs whose chosen
    answer the model finds the likelier (summed log-likelihood; ``acc_norm`` per byte), the policy's
    own preference without a reference, comparable between the base model and the tuned one."""
    import yaml

    folder = run.run_dir / EVALUATION_DIR / "tasks" / HELDOUT
    folder.mkdir(parents=True, exist_ok=True)
    data_file = folder / f"{HELDOUT}.jsonl"
    data_file.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    config = {
        "task": HELDOUT, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data_file)}},
        "test_split": "test", "output_type": "multiple_choice", "doc_to_text": "{{prompt}}",
        "doc_to_choice": "{{choices}}", "doc_to_target": "{{label}}", "target_delimiter": "",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                        {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1, "source": f"the held-out preference pairs of {run.run_dir}",
                     "prompts": "rendered with the run's chat template; choice 0 is the chosen answer"},
    }
    (folder / f"{HELDOUT}.yaml").write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return folder


def _heldout_split(run: Target, record: dict, data):
    from workbench.config import DatasetChoice

    if data is not None:
        if hasattr(data, "keys"):
            return data if "validation" in data else {"validation": next(iter(data.values()))}
        from workbench.sources.data import load_splits, resolve_data_source

        return load_splits(DatasetChoice(source=resolve_data_source(data), path=str(data)))
    facts = record.get("data") or {}
    if facts.get("source") not in ("files", "hub"):
        raise EvaluationError(f"The run in {run.run_dir} trained on an in-memory dataset, so its held-out split "
                              "cannot be loaded again from the run folder.",
                              "pass data= (the DatasetDict or the file it trained on) with tasks=['heldout'].")
    from workbench.sources.data import load_splits

    known = {k: v for k, v in facts.items() if k in DatasetChoice.__dataclass_fields__}
    known["text_columns"] = tuple(known.get("text_columns") or ("text",))
    return load_splits(DatasetChoice(**known))
