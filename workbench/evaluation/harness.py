"""``evaluate(models, tasks)``: lm-evaluation-harness on each model, the same way its command line runs.

Reads top to bottom: resolve the models (``targets.py``) and the tasks (``tasks.py``; offline
gaps refused before any model loads) -> for each model: ``lm_eval.simple_evaluate`` -> save its
results into its run folder and refresh that model folder's card -> one ``EvaluationResult``.

**As fast as the harness's own command line.** People report the Python API several times
slower than ``lm_eval --model hf ...``; the differences are in the defaults, and here they are
the CLI's:

- models given by path or hub id are loaded by the harness itself from ``model="hf"`` and
  ``model_args`` (``pretrained=``, ``peft=``, ``dtype="auto"``: the checkpoint's own 16-bit
  dtype on a GPU, as the CLI does, not the fp32 a hand-loaded model gets), on the GPU when there
  is one;
- ``batch_size`` is passed (the Python HFLM defaults to 1; the CLI is usually given more);
- ``log_samples`` is False unless asked (the Python default, True, keeps and serializes every
  prompt and answer);
- a LoRA run is evaluated through its merged model when ``model_merged/`` is up to date (no
  adapter layers on every forward);
- ``TOKENIZERS_PARALLELISM`` is set to false as the CLI sets it.

``benchmarks/evaluate_vs_lm_eval_cli.py`` measures both side by side.

A model object (``evaluate((model, tokenizer), ...)``) is wrapped in the harness's ``HFLM``
as it is: its device and dtype are the caller's, and it is put back in the train/eval mode it
had.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path

from workbench.errors import EvaluationError
from workbench.evaluation import targets as target_forms
from workbench.evaluation import tasks as task_plans
from workbench.evaluation.progress import harness_progress, quiet_libraries
from workbench.evaluation.results import EvaluationResult, ModelScores, save
from workbench.shipping.card import safe_write_card

DTYPES = ("auto", "float32", "bfloat16", "float16")


def evaluate(models, tasks: Sequence[str] | str = ("heldout",), *, include_path=None, limit: int | float | None = None,
             num_fewshot: int | None = None, apply_chat_template: bool = False, system_instruction: str | None = None,
             fewshot_as_multiturn: bool | None = None, batch_size: int | str = 8, device: str | None = None,
             dtype: str = "auto", checkpoint: str = "final", tokenizer=None, data=None, log_samples: bool = False,
             save_results: bool = True, gen_kwargs: dict | None = None, text_columns=None,
             label_column: str | None = None, listeners: Sequence[Callable[[dict], None]] = ()) -> EvaluationResult:
    """Evaluate ``models`` on ``tasks`` with lm-evaluation-harness; see ``workbench.evaluate``."""
    if dtype not in DTYPES:
        raise EvaluationError(f"dtype={dtype!r} is not one of {', '.join(DTYPES)}.",
                              "use 'auto' (the checkpoint's own dtype, as the harness's command line does).")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # as lm_eval's CLI; fork-safe tokenizers
    chosen = target_forms.resolve_all(models, checkpoint=checkpoint, tokenizer=tokenizer)

    def emit(event: dict) -> None:
        for listener in listeners:
            listener(event)

    if label_column is not None or (data is not None and all(t.task == "classification" for t in chosen)):
        if data is None:
            raise EvaluationError("label_column= scores a classifier on labelled data, and no data= was given.",
                                  "pass data='test.csv' (a labelled file) with text_columns= and label_column=.")
        return _classifier_reports(chosen, data, text_columns, label_column or "label", batch_size, device,
                                   save_results, emit)
    plan, manager = task_plans.plan(tasks, include_path=include_path, targets=chosen, data=data)

    for note in plan.notes:
        emit({"kind": "message", "text": note, "level": "info"})
    device = device or _default_device()
    scored = []
    for index, target in enumerate(chosen):
        emit({"kind": "evaluate_start", "model": target.label, "tasks": plan.names, "models": len(chosen),
              "index": index, "evaluated": target.describe()})
        started = time.perf_counter()
        results, samples = _run_one(target, plan, manager, emit, limit=limit, num_fewshot=num_fewshot,
                                    apply_chat_template=apply_chat_template, system_instruction=system_instruction,
                                    fewshot_as_multiturn=fewshot_as_multiturn, batch_size=batch_size, device=device,
                                    dtype=dtype, log_samples=log_samples, gen_kwargs=gen_kwargs)
        meta = {
            "kind": "lm_eval", "model": target.label, "evaluated": target.describe(), "source": target.kind,
            "folder": target.folder_name, "pretrained": target.pretrained, "peft": target.peft,
            "tasks": plan.names, "task_kinds": plan.kinds, "include_path": plan.include_path,
            "num_fewshot": num_fewshot, "apply_chat_template": bool(apply_chat_template),
            "fewshot_as_multiturn": fewshot_as_multiturn, "system_instruction": system_instruction,
            "limit": limit, "batch_size": batch_size, "device": device, "dtype": dtype,
            "log_samples": log_samples, "seconds": round(time.perf_counter() - started, 2),
            "lm_eval_version": metadata.version("lm_eval"),
        }
        scored.append(_keep(target, ModelScores(target.label, results, meta), samples, save_results, emit))
    return EvaluationResult(scored)


def _classifier_reports(chosen, data, text_columns, label_column, batch_size, device, save_results,
                        emit) -> EvaluationResult:
    from workbench.evaluation import classifier

    scored = []
    for index, target in enumerate(chosen):
        classifier.check_classifier(target)
        emit({"kind": "evaluate_start", "model": target.label, "tasks": [str(data)], "models": len(chosen),
              "index": index, "evaluated": target.describe()})
        with quiet_libraries():
            results, meta = classifier.report(target, data, text_columns=text_columns, label_column=label_column,
                                              batch_size=int(batch_size) if str(batch_size).isdigit() else 32,
                                              device=device)
        scored.append(_keep(target, ModelScores(target.label, results, meta), None, save_results, emit))
    return EvaluationResult(scored)


def _keep(target, scores: ModelScores, samples: dict | None, save_results: bool, emit) -> ModelScores:
    """A run's scores into its folder (and its cards rewritten with them); the end event either way."""
    if save_results and target.run_dir is not None:
        save(target.run_dir, scores, samples)
        _refresh_cards(target)
    emit({"kind": "evaluate_end", "model": target.label, "seconds": scores.meta["seconds"],
          "scores": [{k: r[k] for k in ("column", "value", "stderr")} for r in scores.rows()],
          "saved": str(scores.saved) if scores.saved else None})
    return scores


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _run_one(target, plan, manager, emit, *, limit, num_fewshot, apply_chat_template, system_instruction,
             fewshot_as_multiturn, batch_size, device, dtype, log_samples, gen_kwargs) -> tuple[dict, dict | None]:
    import lm_eval

    kwargs = dict(tasks=list(plan.names), task_manager=manager, num_fewshot=num_fewshot, limit=limit,
                  batch_size=batch_size, device=device, log_samples=log_samples,
                  apply_chat_template=apply_chat_template, system_instruction=system_instruction,
                  gen_kwargs=gen_kwargs)
    if fewshot_as_multiturn is not None:
        kwargs["fewshot_as_multiturn"] = fewshot_as_multiturn
    was_training = None

    def relay(event: dict) -> None:
        emit({**event, "model": target.label})

    with quiet_libraries(), harness_progress(relay):
        try:
            if target.kind == "object":
                from lm_eval.models.huggingface import HFLM

                was_training = getattr(target.model, "training", None)
                model = HFLM(pretrained=target.model, tokenizer=target.tokenizer, batch_size=batch_size)
                results = lm_eval.simple_evaluate(model=model, **kwargs)
            else:
                model_args = {"pretrained": target.pretrained, "dtype": dtype}
                if target.peft:
                    model_args["peft"] = target.peft
                results = lm_eval.simple_evaluate(model="hf", model_args=model_args, **kwargs)
        except EvaluationError:
            raise
        except Exception as exc:
            raise _explain(exc, target) from exc
        finally:
            if was_training:
                target.model.train()
    if results is None:
        raise EvaluationError(f"lm-evaluation-harness returned no results for {target.label}.",
                              "evaluate in a single process (not under torchrun / accelerate launch).")
    samples = results.pop("samples", None)  # the per-sample log: saved apart, never kept in the results
    return results, samples if log_samples else None


def _explain(exc: Exception, target) -> EvaluationError:
    """A harness failure as an EvaluationError that says which model and what to try."""
    from workbench.sources.hub import OFFLINE_FIX, is_offline

    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    fix = ("check the model loads with transformers (AutoModelForCausalLM.from_pretrained) and the task "
           "name; with limit=4 an evaluation fails fast.")
    if is_offline() and any(w in reason.lower() for w in ("offline", "connection", "not found", "couldn't")):
        fix = OFFLINE_FIX + "; datasets must be in the local cache too"
    return EvaluationError(f"lm-evaluation-harness failed on {target.label} ({target.describe()}): {type(exc).__name__}: {reason}", fix)


def _refresh_cards(target) -> None:
    """The evaluated model's card (and the run's final-model cards, which list its scores) rewritten."""
    run_dir = target.run_dir
    names = {"best"} if target.folder_name == "best" else {"model", "model_merged"}
    for name in sorted(names):
        folder = Path(run_dir) / name
        if folder.is_dir():
            safe_write_card(folder, run_dir, kind=name, extra=_best_extra(folder))


def _best_extra(folder: Path) -> dict | None:
    import json

    try:
        return json.loads((folder / "best.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
