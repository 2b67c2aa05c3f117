"""The model card: a README.md in every saved model folder, written from the run folder.

``write_card(folder, run_dir)`` is called by the engine for ``model/`` and ``best/`` (inside the
atomic save, before the folder is renamed into place), by the task's ``finish`` writer for
``model_merged/``, by an evaluation (the card is rewritten with its ``eval_results``) and by
the GGUF export. It reads only the run folder, never the engine's memory:

    run.json                  the run record: settings, data, LoRA, the model, software, hardware
    events.jsonl              status, evaluations (step 0 = the base model), time, throughput
    evaluation/results-*.json benchmark scores (``workbench.evaluate``)
    the model folder itself   adapter or full model, tokenizer, chat template

It is written with huggingface_hub's ``ModelCard`` / ``ModelCardData``: the YAML metadata the
Hub reads (``base_model``, ``datasets``, ``tags``, ``eval_results`` as a ``model-index`` with
the task and dataset fields filled, or the Hub drops them) and a Markdown body. Nothing here
calls the network: ``ModelCard.validate()`` posts the card to the Hub, so it is never called.

The run's verdict (``engine/verdict.py``) opens the results, and the training table says which
precision ran and why. Fields the run record or the events gain later appear by themselves in
"Other facts of the run": the card lists every field it does not show elsewhere. A card must
never cost a saved model: a failure to write one is a warning and a stub README that says why
(``safe_write_card``).

Why ~520 lines: one section function per part of the card, read in the card's order. The next
split: the Hub metadata (``_training_eval_results``, ``_benchmark_eval_results``) into
``card_metadata.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from workbench.engine.benchmarks import column_name, evaluation_results, latest_scores, score_rows
from workbench.engine.events import read_events
from workbench.engine.run_folder import RUN_RECORD, read_run
from workbench.sources.paths import looks_like_local_path

CARD_FILE = "README.md"
CHECKPOINTS = "checkpoints"

# What each folder of a run holds, in the card's first sentence.
KINDS = {
    "model": "the final model of the run",
    "best": "the best model of the run (by its selection metric)",
    "model_merged": "the final model of the run with its LoRA adapter merged into the base weights",
    "gguf": "a GGUF export of the run's final model (llama.cpp, Ollama, LM Studio)",
}
# The pipeline each task's model is loaded with (the Hub's pipeline_tag), and what its training is called.
PIPELINE_TAGS = {"causal_lm": "text-generation", "preference": "text-generation", "classification": "text-classification",
                 "token_classification": "token-classification", "question_answering": "question-answering"}
METHODS = {"classification": "fine-tuning (sequence classification)",
           "token_classification": "fine-tuning (token classification: a tag per word)",
           "question_answering": "fine-tuning (extractive question answering: a span of the context)"}
# Record keys the card shows in its own sections; any other key goes to "Other facts".
_SHOWN_RECORD = {"config", "seed", "precision", "world_size", "environment", "argv", "model", "model_content",
                 "task", "finetune", "data_fingerprint", "data_format", "loss_on", "chat_template",
                 "parameters", "lora", "labels", "text_columns", "label_column", "data", "padding_free",
                 "dropped_rows", "columns", "tag_scheme", "subword_labels", "doc_stride",
                 "precision_reason", "verdict"}
_SHOWN_START = {"kind", "time", "model", "total_steps", "num_epochs", "config", "world_size", "precision",
                "precision_reason",
                "device", "resumed_from_step", "label_names", "run_id", "pid", "host"}
_SHOWN_END = {"kind", "time", "status", "step", "metrics", "verdict"}


# ----------------------------------------------------------------------------- reading the run
def read_record(run_dir: str | os.PathLike) -> dict:
    """The run record: ``run.json`` at the top of the run folder, else the newest checkpoint's
    (runs from before the record was written there); {} when there is none."""
    run_dir = Path(run_dir)
    candidates = [run_dir / RUN_RECORD]
    try:
        steps = sorted(p for p in (run_dir / CHECKPOINTS).iterdir() if p.name.startswith("step-"))
        candidates += [p / RUN_RECORD for p in reversed(steps)]
    except OSError:
        pass
    for path in candidates:
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            return record
    return {}


# ----------------------------------------------------------------------------- the card
def build_card(folder: str | os.PathLike, run_dir: str | os.PathLike | None = None, *, kind: str | None = None,
               extra: dict | None = None, export: dict | None = None, location: str | os.PathLike | None = None):
    """The ModelCard of ``folder`` (a model folder of the run in ``run_dir``; default: its parent).

    ``kind``: model | best | model_merged | gguf (default: the folder's name). ``extra``: the
    best model's ``best.json`` facts (step, metrics). ``export``: a GGUF export's facts (file,
    type, verification figures, Modelfile) for its card. ``location``: where the folder will be
    once written (the card is written into a temporary folder that is then renamed): the path the
    usage examples load.
    """
    from huggingface_hub import ModelCard, ModelCardData

    folder = Path(folder)
    run_dir = Path(run_dir) if run_dir is not None else folder.parent
    kind = kind or (folder.name if folder.name in KINDS else "model")
    record = read_record(run_dir)
    run = read_run(run_dir)
    events = _safe_events(run_dir)
    starts = [e for e in events if e.get("kind") == "start"]
    ends = [e for e in events if e.get("kind") == "end"]
    config = record.get("config") or (starts[-1].get("config") if starts else {}) or {}
    task = record.get("task") or config.get("task") or run.task or "classification"
    causal = task in ("causal_lm", "preference")
    adapter = (folder / "adapter_config.json").is_file()
    base = record.get("model") or run.model or _adapter_base(folder)
    data = record.get("data") or {}
    name = f"{run_dir.name}-{kind}" if kind != "model" else run_dir.name
    folders = ("best",) if kind == "best" else ("model", "model_merged")
    benchmarks = evaluation_results(run_dir, folders)
    step0 = next((e for e in events if e.get("kind") == "eval" and e.get("step") == 0), None)

    eval_results = _training_eval_results(task, data, config, run.metrics if kind != "best" else
                                          (extra or {}).get("metrics", {}), name)
    eval_results += _benchmark_eval_results(benchmarks)
    card_data = ModelCardData(
        model_name=name,
        base_model=base if base and not looks_like_local_path(str(base)) else None,
        datasets=[data["path"]] if data.get("source") == "hub" and data.get("path") else None,
        library_name="peft" if adapter else ("transformers" if kind != "gguf" else None),
        pipeline_tag=PIPELINE_TAGS.get(task, "text-classification"),
        tags=[t for t in ("workbench", task, record.get("finetune"), "gguf" if kind == "gguf" else None,
                          "lora" if record.get("lora") else None) if t],
        metrics=sorted({m.removeprefix("eval_") for m in run.metrics}) or None,
        eval_results=eval_results or None,
    )
    sections = [
        _title(name, kind, base, data, task, record, adapter),
        _usage(Path(location) if location else folder, kind, task, adapter, base, export),
        _export_section(export) if export else "",
        _training_section(record, config, data, run, starts, task),
        _results_section(run, kind, extra, step0, ends, record),
        _benchmarks_section(benchmarks),
        _template_section(folder, record, config) if causal else "",
        _software_section(record),
        _other_facts(record, starts, ends),
    ]
    body = "\n\n".join(s for s in sections if s) + "\n"
    return ModelCard.from_template(card_data, template_str="---\n{{ card_data }}\n---\n\n{{ body }}", body=body)


def write_card(folder: str | os.PathLike, run_dir: str | os.PathLike | None = None, **kwargs) -> Path:
    """Write ``folder/README.md`` (see :func:`build_card`); returns its path."""
    card = build_card(folder, run_dir, **kwargs)
    path = Path(folder) / CARD_FILE
    tmp = path.with_name(f".{CARD_FILE}.tmp-{os.getpid()}")
    tmp.write_text(str(card), encoding="utf-8")
    os.replace(tmp, path)  # a reader sees the old card or the new one, never half of one
    return path


def safe_write_card(folder: str | os.PathLike, run_dir: str | os.PathLike | None = None, **kwargs) -> Path | None:
    """:func:`write_card`, but a failure only warns (and leaves a stub README saying why): the model
    folder it belongs to is what matters, and it must be saved whatever the card's problem."""
    try:
        return write_card(folder, run_dir, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the card is documentation; the weights are the result
        reason = f"{type(exc).__name__}: {exc}"
        warnings.warn(f"workbench: could not write the model card of {folder}: {reason}", stacklevel=2)
        with contextlib.suppress(OSError):
            (Path(folder) / CARD_FILE).write_text(
                f"# {Path(folder).name}\n\nThe model card could not be written ({reason}). Rewrite it with "
                "`from workbench.shipping.card import write_card; write_card(folder)`.\n", encoding="utf-8")
        return None


# ----------------------------------------------------------------------------- sections
def _title(name, kind, base, data, task, record, adapter) -> str:
    what = KINDS.get(kind, "a model of the run")
    method = {"lora": "LoRA", "qlora": "QLoRA", "full": "full fine-tuning"}.get(record.get("finetune"), "fine-tuning")
    method = METHODS.get(task, method)
    lines = [f"# {name}", "",
             f"This folder holds {what}: `{base}` trained with {method} on {_data_name(data)} with "
             "the workbench."]
    if adapter:
        lines.append("It is a LoRA adapter (a few MB): it needs the base model to run; `model_merged/` "
                     "beside it, when present, is the same model as one plain folder.")
    return "\n".join(lines)


def _usage(folder, kind, task, adapter, base, export) -> str:
    path = str(folder)
    if kind == "gguf" and export:
        gguf = export.get("file", "model.gguf")
        tag = export.get("ollama_name", "my-model")
        return "\n".join([
            "## How to use it", "",
            "With [Ollama](https://ollama.com) (the `Modelfile` beside this card sets the chat template, "
            "the stop tokens and the system prompt):", "",
            "```sh", f"ollama create {tag} -f Modelfile", f"ollama run {tag}", "```", "",
            "With [llama.cpp](https://github.com/ggml-org/llama.cpp) (the chat template travels in the file):", "",
            "```sh", f"llama-cli -m {gguf} -cnv", f"llama-server -m {gguf} --port 8080", "```", "",
            "LM Studio: import the `.gguf` file (My Models -> Import).",
        ])
    if task == "token_classification":
        code = ["```python", "from transformers import pipeline", "",
                f"tagger = pipeline(\"token-classification\", model={path!r}, aggregation_strategy=\"simple\")",
                "print(tagger(\"Angela Merkel visited Paris.\"))  # entities with their type, score and characters",
                "```"]
    elif task == "question_answering":
        code = ["```python", "from transformers import pipeline", "",
                "# transformers 5 has no question-answering pipeline: this folder carries one (qa_pipeline.py,",
                "# read it first); trust_remote_code lets transformers run it.",
                f"qa = pipeline(\"question-answering\", model={path!r}, trust_remote_code=True)",
                "print(qa(question=\"Where was Marie Curie born?\", context=\"Marie Curie was born in Warsaw.\"))",
                "```"]
    elif task in ("causal_lm", "preference"):
        code = ["```python", "from transformers import pipeline", "",
                f"generator = pipeline(\"text-generation\", model={path!r})",
                "reply = generator([{\"role\": \"user\", \"content\": \"Hello!\"}], max_new_tokens=128)",
                "print(reply[0][\"generated_text\"][-1][\"content\"])", "```"]
        if adapter:
            code += ["", "Or as an adapter on its base model (peft):", "", "```python",
                     "from peft import AutoPeftModelForCausalLM", "",
                     f"model = AutoPeftModelForCausalLM.from_pretrained({path!r})  # loads {base}", "```"]
        code += ["", "To run it with Ollama or llama.cpp: `workbench export RUN --gguf q8_0` writes a GGUF "
                 "file and a Modelfile."]
    else:
        code = ["```python", "from transformers import pipeline", "",
                f"classifier = pipeline(\"text-classification\", model={path!r})",
                "print(classifier(\"A wonderful film.\"))", "```"]
    return "\n".join(["## How to use it", "", *code])


def _export_section(export: dict) -> str:
    lines = ["## The GGUF file", "",
             f"- file: `{export.get('file')}` ({export.get('type')}, {export.get('size_mb', 0):,.1f} MB), "
             f"architecture `{export.get('architecture')}`, {export.get('tensors')} tensors",
             f"- tokenizer: `{export.get('tokenizer_model')}` / pre-tokenizer `{export.get('tokenizer_pre')}`, "
             f"{export.get('vocab_size')} tokens; BOS {export.get('bos_id')}, EOS {export.get('eos_id')}, "
             f"end of turn {export.get('eot_id')}; the chat template is in the file",
             f"- written by the `gguf` package {export.get('gguf_version')} (pure Python; no llama.cpp build)"]
    check = export.get("verification") or {}
    if check:
        lines += ["", "Checked when it was written: the file was read back, loaded through transformers "
                  "(`gguf_file=`) and its logits compared with the merged model's on fixed prompts:", "",
                  f"- token ids identical on {check.get('prompts')} prompts: {check.get('token_ids_identical')}",
                  f"- max |logit difference|: {check.get('max_abs_logit_diff', float('nan')):.4g} "
                  f"(logits span {check.get('logit_range', float('nan')):.3g})",
                  f"- same top-1 token at {check.get('top1_agreement', float('nan')):.1%} of "
                  f"{check.get('positions')} positions"]
    return "\n".join(lines)


def _training_section(record, config, data, run, starts, task) -> str:
    env = record.get("environment") or {}
    lora = record.get("lora") or {}
    params = record.get("parameters") or {}
    rows = [
        ("base model", f"`{record.get('model') or run.model}`"),
        ("data", _data_name(data) + (f" (train split `{data.get('train_split')}`, eval split "
                                      f"`{data.get('eval_split')}`)" if data.get("train_split") else "")),
        ("data fingerprint", f"`{record.get('data_fingerprint')}`" if record.get("data_fingerprint") else None),
        ("data format", record.get("data_format")),
        ("task", task),
        ("fine-tuning", record.get("finetune") or ("full" if task != "causal_lm" else None)),
        ("LoRA", f"rank {lora.get('r')}, alpha {lora.get('alpha')}, dropout {lora.get('dropout')}, on "
                 f"{', '.join(f'`{t}`' for t in lora.get('target_modules') or [])}" if lora else None),
        ("trainable parameters", f"{params['trainable']:,} of {params['total']:,}"
         if params.get("trainable") and params.get("total") else None),
        ("labels", ", ".join(map(str, record.get("labels") or [])) or None),
        ("columns", ", ".join(f"`{c}`" for c in record.get("columns") or []) or None),
        ("tag scheme", record.get("tag_scheme")),
        ("sub-word labels", {"all": "every sub-word of a word", "first": "the first sub-word of each word"}.get(
            record.get("subword_labels"))),
        ("windows", f"{config.get('max_length')} tokens, {record['doc_stride']} shared by consecutive windows"
         if record.get("doc_stride") else None),
        ("loss on", record.get("loss_on")),
        ("preference loss", _preference(record.get("preference"))),
        ("system prompt", repr(config.get("system_prompt")) if config.get("system_prompt") else None),
        ("precision", _precision(record, starts)),
        ("epochs / steps", f"{config.get('num_epochs')} epochs" + (f", max_steps {config['max_steps']}"
                                                                   if config.get("max_steps") else "")
         + (f"; {run.step} of {run.total_steps} steps done" if run.total_steps else "")),
        ("batch", f"{config.get('batch_size')} {'pairs' if task == 'preference' else 'rows'} x {config.get('gradient_accumulation_steps', 1)} accumulation"
                  f" x {record.get('world_size', 1)} processes"),
        ("learning rate", f"{config.get('learning_rate')} ({config.get('scheduler')} schedule, warmup "
                          f"{config.get('warmup_ratio')}, weight decay {config.get('weight_decay')})"),
        ("max length", f"{config.get('max_length')} tokens"),
        ("seed", record.get("seed", config.get("seed"))),
        ("training time", _duration(run.duration_s)),
        ("hardware", _hardware(env, record)),
        ("throughput", f"{run.samples_per_s:.1f} rows/s" if run.samples_per_s else None),
        ("peak GPU memory", f"{run.peak_gpu_mem_bytes / 2**30:.2f} GiB" if run.peak_gpu_mem_bytes else None),
    ]
    return "## Training\n\n" + _table(("", ""), [(k, v) for k, v in rows if v not in (None, "")])


def _preference(facts: dict | None) -> str | None:
    """``dpo, beta 0.1; reference: the base model (...)``: what a preference run optimized, against what."""
    if not facts:
        return None
    text = f"{facts.get('loss')}, beta {facts.get('beta')}"
    if facts.get("simpo_gamma") is not None:
        text += f", gamma {facts['simpo_gamma']}"
    return text + f"; reference: {facts.get('reference') or 'none (reference-free)'}"


def _precision(record: dict, starts: list[dict]) -> str | None:
    """"bf16 (auto: bf16, this CPU computes it natively)": what ran, and why when the run said."""
    start = starts[-1] if starts else {}
    ran = record.get("precision") or start.get("precision")
    reason = record.get("precision_reason") or start.get("precision_reason")
    return f"{ran} ({reason})" if ran and isinstance(reason, str) and reason else ran


def _results_section(run, kind, extra, step0, ends, record) -> str:
    lines = ["## Results on the held-out split", ""]
    # Did the run learn anything (engine/verdict.py)? Said first: a card must not sell a run that did not.
    verdict = record.get("verdict") or next((e["verdict"] for e in reversed(ends) if e.get("verdict")), None)
    if isinstance(verdict, dict) and verdict.get("text"):
        warn = verdict.get("outcome") in ("no_better", "worse")
        lines += [f"{'**Warning.** ' if warn else ''}Verdict of the run (its final evaluation against a model "
                  f"that learned nothing): {verdict['text']}", ""]
    shown = (extra or {}).get("metrics") if kind == "best" else run.metrics
    if kind == "best" and extra:
        lines.append(f"This is the model of step {extra.get('step')} (the best by "
                     f"`{run.best_metric or 'the selection metric'}` when it was saved).")
    elif run.best_metric and run.best_value is not None:
        lines.append(f"Best `{run.best_metric}`: {run.best_value:.4g} at step {run.best_step}.")
    names = sorted({*(shown or {}), *((step0 or {}).keys() & set(shown or {}))})
    if not names:
        return "\n".join([*lines, "", "No evaluation had run when this card was written."])
    header = ("metric", "base model (step 0)", "this model") if step0 else ("metric", "this model")
    rows = [(f"`{n}`", *((_num(step0.get(n)),) if step0 else ()), _num((shown or {}).get(n))) for n in names]
    return "\n".join([*lines, "", _table(header, rows)])


def _benchmarks_section(benchmarks: list[dict]) -> str:
    if not benchmarks:
        return ""
    latest = latest_scores(benchmarks)
    rows = [(row["task"], column_name(row).split("/", 1)[1],
             _num(row["value"]) + (f" ± {row['stderr']:.3g}" if row["stderr"] is not None else ""),
             row["shots"], "on" if row["chat_template"] else "off", row["samples"],
             "" if row["limit"] is None else row["limit"]) for row in latest.values()]
    version = next(((b.get("workbench") or {}).get("lm_eval_version") for b in reversed(benchmarks)
                    if (b.get("workbench") or {}).get("lm_eval_version")), None)
    return "\n".join([
        "## Evaluations", "",
        "Benchmarks measured with [lm-evaluation-harness](https://github.com/EleutherAI/lm-evaluation-harness)"
        f"{' ' + version if version else ''} through `workbench.evaluate` (and classifier reports on labelled files); "
        "± is the standard error. Scores with another number of shots or another chat-template setting are not "
        "comparable.", "",
        _table(("task", "metric", "value", "shots", "chat template", "samples", "limit"), rows)])


def _template_section(folder: Path, record: dict, config: dict) -> str:
    template = _chat_template(folder)
    if not template:
        return ""
    fence = "`" * max(3, _longest_run(template, "`") + 1)
    source = {"tokenizer": "the base model's own", "simple": "the workbench's simple template",
              "custom": "a template given to the run"}.get(record.get("chat_template"), "")
    return "\n".join(["## Chat template", "", f"Prompts must be rendered with this template ({source}); "
                      "the tokenizer in this folder applies it (`tokenizer.apply_chat_template`).", "",
                      f"{fence}jinja", template, fence])


def _software_section(record: dict) -> str:
    env = record.get("environment") or {}
    packages = {**(env.get("packages") or {})}
    from importlib import metadata

    for name in ("peft", "huggingface_hub", "lm_eval", "gguf"):
        if name not in packages:
            try:
                packages[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
    rows = [(name, version) for name, version in packages.items() if version]
    if env.get("python"):
        rows.insert(0, ("python", env["python"]))
    if env.get("cuda"):
        rows.append(("CUDA", env["cuda"]))
    return "## Software\n\n" + _table(("package", "version"), rows) if rows else ""


def _other_facts(record: dict, starts: list[dict], ends: list[dict]) -> str:
    """Every field of the record and of the last start / end event that no section shows."""
    rows = [(f"`{k}`", _cell(v)) for k, v in record.items() if k not in _SHOWN_RECORD]
    if starts:
        rows += [(f"`start.{k}`", _cell(v)) for k, v in starts[-1].items() if k not in _SHOWN_START]
    if ends:
        rows += [(f"`end.{k}`", _cell(v)) for k, v in ends[-1].items() if k not in _SHOWN_END]
    if not rows:
        return ""
    return "## Other facts of the run\n\n" + _table(("field", "value"), rows)


# ----------------------------------------------------------------------------- eval_results
def _training_eval_results(task, data, config, metrics, name) -> list:
    """The held-out evaluation as Hub eval results (task and dataset fields filled)."""
    from huggingface_hub import EvalResult

    if not metrics or not (data.get("path") or data.get("name")):
        return []  # the Hub needs a dataset to file a result under: an unnamed in-memory one has none
    task_type = PIPELINE_TAGS.get(task, "text-classification")
    dataset_type = data.get("path") if data.get("source") == "hub" else (data.get("format") or "json")
    found = []
    for key, value in sorted(metrics.items()):
        if not isinstance(value, (int, float)) or value != value:  # NaN
            continue
        found.append(EvalResult(task_type=task_type, dataset_type=str(dataset_type), dataset_name=_data_name(data, md=False),
                                dataset_config=data.get("config_name"), dataset_split=data.get("eval_split"),
                                metric_type=key.removeprefix("eval_"), metric_value=round(float(value), 6),
                                metric_name=f"held-out {key.removeprefix('eval_')}"))
    return found


def _benchmark_eval_results(benchmarks: list[dict]) -> list:
    from huggingface_hub import EvalResult

    latest: dict[str, Any] = {}
    for result in benchmarks:  # oldest first: a later evaluation of the same task and metric wins
        configs = result.get("configs") or {}
        meta = result.get("workbench") or {}
        for row in score_rows(result):
            task_config = configs.get(row["task"]) or {}
            shots = row["shots"]
            classifier = meta.get("kind") == "classifier"
            latest[column_name(row)] = EvalResult(
                task_type="text-classification" if classifier else "text-generation", task_name=row["task"],
                dataset_type=str(task_config.get("dataset_path") or row["task"]),
                dataset_name=row["task"], dataset_config=task_config.get("dataset_name"),
                dataset_split=task_config.get("test_split") or task_config.get("validation_split"),
                metric_type=row["metric"], metric_value=round(row["value"], 6),
                metric_name=f"{column_name(row).split('/', 1)[1]} ({shots}-shot, chat template "
                            f"{'on' if row['chat_template'] else 'off'})",
                # The Hub wants a source's URL with its name: the harness has one, a classifier report none.
                source_name=None if classifier else f"lm-evaluation-harness {meta.get('lm_eval_version') or ''}".strip(),
                source_url=None if classifier else "https://github.com/EleutherAI/lm-evaluation-harness")
    return list(latest.values())


# ----------------------------------------------------------------------------- helpers
def _safe_events(run_dir: Path) -> list[dict]:
    try:
        return read_events(run_dir)
    except Exception:  # noqa: BLE001 - no log (a copied folder): the record alone makes the card
        return []


def _adapter_base(folder: Path) -> str | None:
    try:
        return json.loads((folder / "adapter_config.json").read_text(encoding="utf-8")).get("base_model_name_or_path")
    except (OSError, ValueError):
        return None


def _chat_template(folder: Path) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    try:
        template = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")).get("chat_template")
    except (OSError, ValueError):
        return None
    return template if isinstance(template, str) else None


def _data_name(data: dict, md: bool = True) -> str:
    if not data:
        return "data not recorded (an in-memory dataset)"
    path = data.get("path") or data.get("name")
    if not path:
        return "an in-memory dataset"
    shown = f"`{path}`" if md else str(path)
    return f"{shown}{' (' + data['config_name'] + ')' if data.get('config_name') else ''}"


def _hardware(env: dict, record: dict) -> str:
    if env.get("gpu_model"):
        count = env.get("gpu_count") or 1
        return f"{count} x {env['gpu_model']}" + (f" ({record.get('world_size')} processes)"
                                                   if record.get("world_size", 1) > 1 else "")
    return f"CPU ({env.get('platform', 'unknown platform')})" if env else None


def _duration(seconds) -> str | None:
    if not isinstance(seconds, (int, float)):
        return None
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"


def _num(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-" if value is None else str(value)
    return f"{value:.4g}"


def _cell(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text.replace("|", "\\|").replace("\n", " ")[:300]


def _longest_run(text: str, char: str) -> int:
    longest = current = 0
    for c in text:
        current = current + 1 if c == char else 0
        longest = max(longest, current)
    return longest


def _table(header: tuple, rows: Iterable[tuple]) -> str:
    rows = [tuple("" if c is None else str(c).replace("|", "\\|").replace("\n", " ") for c in row) for row in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
