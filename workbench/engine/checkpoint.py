"""Atomic checkpoints that hold everything needed to continue a run exactly.

Layout under ``<output_dir>/checkpoints/``::

    step-000120/   model.safetensors optimizer.bin scheduler.bin [scaler.pt]
                   random_states_<rank>.pkl state.json run.json manifest.json

What goes in is Accelerate's ``save_state``: the model (the task decides which
weights: all of them, or a LoRA adapter's), the optimizer (sharded under FSDP),
the schedule, the fp16 scaler and every process's RNG streams; ``load_state``
puts them back. This module adds what makes a checkpoint safe to resume from: the
position in the epoch (``state.json``), the run record (``run.json``), and
atomicity. Every process writes into ``.tmp-step-000120/``, then the main process
fsyncs every file, writes ``manifest.json`` (file names and sizes) last, renames
the folder into place and fsyncs the parent. A crash or ``kill -9`` at any moment
leaves either the previous checkpoints untouched or a dot-folder that is never
chosen: only folders whose manifest matches their files count as valid.

Why one module of ~560 lines: writing, checking and resuming a checkpoint share its layout
and its atomic-folder rules; the final and best model folders use the same writer. The next
split: the run record and its comparison on resume (``environment`` to ``check_same_run``) into
``run_record.py``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import random
import re
import shutil
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workbench.engine.distributed import any_process
from workbench.errors import CheckpointError
from workbench.shipping.card import safe_write_card

CHECKPOINTS = "checkpoints"
MANIFEST = "manifest.json"
STATE = "state.json"
RUN_RECORD = "run.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")
FORMAT = 2  # 2: Accelerate's save_state files; 1 (workbench 0.1): model.pt, optimizer.pt, ...


def checkpoints_dir(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / CHECKPOINTS


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


@dataclass
class TrainState:
    """Where the run is; saved in each checkpoint's state.json."""

    step: int = 0  # optimizer steps done
    epoch: int = 0  # current epoch (0-based)
    batch_in_epoch: int = 0  # loader batches of this epoch already consumed
    micro_batch_size: int = 0  # after out-of-memory halvings; batch_size otherwise
    skipped_steps: int = 0  # fp16 overflow skips, in total
    consecutive_skips: int = 0
    best_value: float | None = None
    best_step: int | None = None
    metrics: dict = field(default_factory=dict)  # last evaluation
    start_loss: float | None = None  # the training loss before the first update: the divergence guard's start
    # The verdict's baselines (engine/verdict.py): the task's trivial ones, scored on the eval rows;
    # the step-0 evaluation (eval_before_training) and the first evaluation, each with its "step".
    baselines: dict = field(default_factory=dict)
    base_metrics: dict = field(default_factory=dict)
    first_metrics: dict = field(default_factory=dict)
    best_refused_step: int | None = None  # the first evaluation kept out of best/ for not beating them


# ------------------------------------------------------------------ atomic folders
def _fsync_path(path: Path) -> None:
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() and hasattr(os, "O_DIRECTORY") else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_dir_atomically(final: Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp_dir)``, fsync what it wrote, then rename ``tmp_dir`` to ``final``.

    An existing ``final`` is replaced in two renames: ``final`` -> ``.old-<name>-<pid>``,
    then ``tmp`` -> ``final``; the old copy is removed after. Between the two renames
    ``final`` does not exist; a crash there leaves the complete old copy, which
    :func:`remove_stale_temporaries` puts back at the next start.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        write(tmp)
        _swap_into_place(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _swap_into_place(tmp: Path, final: Path) -> None:
    """fsync everything in ``tmp``, then rename it to ``final`` (replacing an existing one).

    An existing ``final`` is moved aside first (``.old-<name>-<pid>``) and removed after
    the swap; a kill between the two renames leaves only that copy, which
    :func:`remove_stale_temporaries` puts back at the next start.
    """
    for path in tmp.rglob("*"):
        if path.is_file():
            _fsync_path(path)
    _fsync_path(tmp)
    old = None
    if final.exists():
        old = final.parent / f".old-{final.name}-{os.getpid()}"
        if old.exists():
            shutil.rmtree(old)
        os.rename(final, old)
    try:
        os.rename(tmp, final)
    except BaseException:
        if old is not None and old.exists() and not final.exists():
            # The second rename failed: put the old copy back rather than leave no ``final``.
            os.rename(old, final)
        raise
    _fsync_path(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


_LEFTOVER = re.compile(r"^\.(?P<kind>tmp|old|del)-(?P<name>.+)-(?P<pid>\d+)$")


def _leftovers(directory: Path) -> list[tuple[str, str, Path]]:
    """(kind, name, path) of the ``.tmp-<name>-<pid>`` / ``.old-<name>-<pid>`` / ``.del-<name>-<pid>`` folders."""
    found = []
    for path in directory.iterdir():
        match = _LEFTOVER.match(path.name)
        if match and path.is_dir():
            found.append((match.group("kind"), match.group("name"), path))
    return found


def remove_stale_temporaries(directory: Path) -> list[str]:
    """Clean up after a save that crashed; returns what was recovered, as messages to log.

    ``.tmp-*`` folders are half-written and removed, ``.del-*`` ones half-deleted (a pruned
    checkpoint, see :func:`prune`) and removed. An ``.old-<name>-*`` folder is
    the previous complete ``<name>``: when ``<name>`` itself is missing, the crash
    came between the two renames of :func:`write_dir_atomically`, and the old copy is
    renamed back (the newest, should several exist) instead of being deleted.

    Call it only while holding the folder's run lock: another live run's ``.tmp-*``
    would otherwise be removed under it.
    """
    directory = Path(directory)
    recovered: list[str] = []
    if not directory.is_dir():
        return recovered
    leftovers = _leftovers(directory)
    olds: dict[str, list[Path]] = {}
    for kind, name, path in leftovers:
        if kind == "old":
            olds.setdefault(name, []).append(path)
    for name, paths in sorted(olds.items()):
        final = directory / name
        if final.exists():
            continue  # the swap finished; these are only the copies it had not removed yet
        newest = max(paths, key=lambda p: p.stat().st_mtime)
        os.rename(newest, final)
        _fsync_path(directory)
        recovered.append(f"Recovered {final} from {newest.name}: a save was interrupted between "
                         "replacing it and putting the new copy in place; this is the copy from before "
                         "that save.")
    for _, _, path in leftovers:
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
    return recovered


# -------------------------------------------------------------------- RNG states
def rng_state() -> dict[str, Any]:
    """Every generator that dropout, shuffling or augmentation can draw from."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        states = state["cuda"]
        if len(states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(states)
        else:  # other GPU count: at least make this device's stream reproducible
            torch.cuda.set_rng_state(states[0])


# -------------------------------------------------------------------- run record
_PACKAGES = ("workbench", "torch", "transformers", "tokenizers", "datasets", "accelerate", "numpy")


def environment() -> dict[str, Any]:
    """Software and hardware facts that can change results when they change."""
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    gpus = []
    if torch.cuda.is_available():
        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": versions,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "gpu_model": gpus[0] if gpus else None,
        "gpu_count": len(gpus),
    }


def run_record(config: dict[str, Any], *, seed: int, precision: str, world_size: int,
               extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "config": config,
        "seed": seed,
        "precision": precision,
        "world_size": world_size,
        "environment": environment(),
        "argv": sys.argv,
        **(extra or {}),
    }


def compare_records(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Human-readable differences in hardware/software between two run records."""
    changes = []
    old_env, new_env = old.get("environment", {}), new.get("environment", {})
    for key in ("python", "cuda", "cudnn", "gpu_model", "gpu_count"):
        if old_env.get(key) != new_env.get(key):
            changes.append(f"{key} {old_env.get(key)} -> {new_env.get(key)}")
    old_pkgs, new_pkgs = old_env.get("packages", {}), new_env.get("packages", {})
    for name in sorted(set(old_pkgs) | set(new_pkgs)):
        if old_pkgs.get(name) != new_pkgs.get(name):
            changes.append(f"{name} {old_pkgs.get(name)} -> {new_pkgs.get(name)}")
    for key in ("precision", "world_size"):
        if old.get(key) != new.get(key):
            changes.append(f"{key} {old.get(key)} -> {new.get(key)}")
    return changes


# What makes a run the same run (written by the task into the run record): resuming another
# run's checkpoint would continue its weights on other data, or fail deep in load_state_dict.
RUN_IDENTITY = ("model", "task", "text_columns", "label_column", "labels", "data_fingerprint",
                "finetune", "data_format", "loss_on", "chat_template", "lora",
                "columns", "tag_scheme", "subword_labels", "doc_stride")  # token classification, QA
# Settings that decide which rows form each batch: a resume with other values would not
# see the batches the first part of the run was planned with.
ORDER_SETTINGS = ("batch_size", "gradient_accumulation_steps", "seed", "max_length", "group_by_length")


def check_same_run(path: Path, before: dict[str, Any], now: dict[str, Any]) -> None:
    """CheckpointError naming every difference when ``path`` belongs to another run."""
    same_weights = before.get("model_content") and before.get("model_content") == now.get("model_content")
    differences = [f"{key} {before.get(key)!r} in the checkpoint, {now.get(key)!r} now"
                   for key in RUN_IDENTITY if key in now and before.get(key) != now.get(key)
                   and not (key == "model" and same_weights)]  # a .gguf and the folder made from it
    old, new = before.get("config", {}), now.get("config", {})
    differences += [f"train.{key} {old.get(key)!r} in the checkpoint, {new.get(key)!r} now"
                    for key in ORDER_SETTINGS if old.get(key) != new.get(key)]
    if any(d.startswith("model ") for d in differences):
        differences.append("(a model is identified by the name or path given; a .gguf file and the folder "
                           "converted from it count as the same model, other copies of a model do not)")
    if differences:
        run_dir = Path(path).parent.parent
        raise CheckpointError(
            f"The checkpoint {path} belongs to a different run: " + "; ".join(differences) + ".",
            f"give this run a new output_dir; or, to start over in {run_dir}, move its old contents "
            "aside and pass resume=None.")


# ------------------------------------------------------------- save / find / load
def save_checkpoint(accelerator, output_dir: str | os.PathLike, step: int, state: dict[str, Any],
                    record: dict[str, Any], keep: int | None = None) -> Path:
    """Save the accelerator's state plus ``state`` and ``record``, atomically. Call on every process.

    ``keep``: afterwards delete all but the newest ``keep`` step checkpoints.
    """
    root = checkpoints_dir(output_dir)
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{final.name}"  # one name all processes (and nodes) agree on
    try:
        if accelerator.is_main_process:
            root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()
        accelerator.wait_for_everyone()
        accelerator.save_state(str(tmp), safe_serialization=True)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            _finish(tmp, final, step, state, record)
            if keep is not None:
                prune(output_dir, keep)
    except OSError as exc:
        raise CheckpointError(f"Could not write checkpoint for step {step} in {root}: {exc}.",
                              "free disk space or choose another output_dir.") from exc
    accelerator.wait_for_everyone()
    return final


def _finish(tmp: Path, final: Path, step: int, state: dict, record: dict) -> None:
    for name, data in ((STATE, state), (RUN_RECORD, record)):
        (tmp / name).write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    files = {p.relative_to(tmp).as_posix(): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
    manifest = {"format": FORMAT, "step": step, "files": files, "complete": True}
    # Written last: its presence (and matching sizes) is what makes the folder valid.
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    _swap_into_place(tmp, final)


def read_record(path: str | os.PathLike) -> dict:
    """The run record of a checkpoint ({} when it cannot be read; validate() says why)."""
    try:
        return json.loads((Path(path) / RUN_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def load_checkpoint(accelerator, path: str | os.PathLike) -> tuple[dict, dict]:
    """Restore the accelerator's state from ``path``; returns (state, run record)."""
    path = Path(path)
    problem = validate(path)
    if problem:
        raise CheckpointError(f"Cannot resume from {path}: {problem}.",
                              "pass resume='auto' to use the newest valid checkpoint, or resume=None to start over.")
    accelerator.load_state(str(path))
    state = json.loads((path / STATE).read_text(encoding="utf-8"))
    record = json.loads((path / RUN_RECORD).read_text(encoding="utf-8"))
    return state, record


def resume(accelerator, path: Path, record: dict) -> tuple[dict, list[tuple[str, str]]]:
    """Check ``path`` belongs to the run ``record`` describes, restore it; returns
    (the saved state.json, (text, level) messages for the run's log)."""
    check_same_run(path, read_record(path), record)
    state, saved_record = load_checkpoint(accelerator, path)
    messages = [(f"Resumed from {path} (step {state.get('step')}).", "info")]
    changes = compare_records(saved_record, record)
    if changes:
        messages.append(("Resuming on different hardware or software, results may differ slightly: "
                         + "; ".join(changes) + ".", "warn"))
    return state, messages


def validate(path: Path) -> str | None:
    """None when ``path`` is a complete checkpoint, else why not."""
    manifest_path = Path(path) / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "no readable manifest.json (the save did not finish)"
    if not manifest.get("complete"):
        return "manifest not marked complete"
    if manifest.get("format") != FORMAT:
        return (f"it was written by another workbench version (checkpoint format {manifest.get('format')}, "
                f"this one reads {FORMAT})")
    for name, size in manifest.get("files", {}).items():
        file = Path(path) / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != size:
            return f"{name} has {file.stat().st_size} bytes, expected {size}"
    return None


def list_checkpoints(output_dir: str | os.PathLike, *, warn: bool = False) -> list[Path]:
    """Valid step checkpoints, oldest first. Invalid ones are skipped (with a warning)."""
    root = checkpoints_dir(output_dir)
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _STEP_DIR.match(path.name)
        if not (match and path.is_dir()):
            continue
        problem = validate(path)
        if problem is None:
            found.append((int(match.group(1)), path))
        elif warn:
            warnings.warn(f"Ignoring checkpoint {path}: {problem}.", stacklevel=2)
    return [p for _, p in sorted(found)]


def step_of(path: Path | None) -> int:
    """The step a checkpoint folder holds (0 for None: a fresh start)."""
    match = _STEP_DIR.match(Path(path).name) if path is not None else None
    return int(match.group(1)) if match else 0


def latest_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    found = list_checkpoints(output_dir, warn=True)
    return found[-1] if found else None


def prune(output_dir: str | os.PathLike, keep: int) -> None:
    """Delete all but the newest ``keep`` step checkpoints, each renamed away first.

    ``rmtree`` of a checkpoint takes a while (hundreds of MB) and a kill in the middle of it
    left a half-deleted ``step-N/`` that looked like a checkpoint and was never removed. The
    rename (``.del-step-N-<pid>``) is atomic: a kill leaves either the whole checkpoint or
    a dot-folder that is never chosen and that :func:`remove_stale_temporaries` deletes at
    the next start.
    """
    root = checkpoints_dir(output_dir)
    doomed = []
    for path in list_checkpoints(output_dir)[:-keep]:
        away = root / f".del-{path.name}-{os.getpid()}"
        os.rename(path, away)
        doomed.append(away)
    if doomed:
        _fsync_path(root)  # the renames are on disk before the deletes begin
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)


def resolve_resume(output_dir: str | os.PathLike, resume: str | None) -> Path | None:
    """``"auto"`` -> newest valid checkpoint or None; a path -> that checkpoint, validated."""
    if resume is None:
        return None
    if resume == "auto":
        return latest_checkpoint(output_dir)
    path = Path(resume)
    problem = validate(path) if path.is_dir() else "not a folder"
    if problem:
        raise CheckpointError(f"Cannot resume from {path}: {problem}.",
                              f"pass resume='auto' to use the newest valid checkpoint in "
                              f"{checkpoints_dir(output_dir)}, or resume=None to start over.")
    return path


# ------------------------------------------------------------- weights and models
def weights_finite(accelerator, model) -> bool:
    """True when no trainable weight is NaN/inf, on every process. A tensor's max-abs
    (inf-norm) is NaN/inf exactly when one of its values is: one fused pass and one host
    sync cost far less than an isfinite().all() sync per tensor (~1 s per save for a
    22M-parameter model)."""
    tensors = [p.detach() for p in model.parameters() if p.requires_grad and p.numel()]
    finite = True
    if tensors:
        norms = torch._foreach_norm([t.float() if t.dtype in (torch.float16, torch.bfloat16) else t
                                     for t in tensors], ord=math.inf)
        finite = bool(torch.isfinite(torch.stack(norms)).all())
    return not any_process(accelerator, not finite)


def keep_task_weights(accelerator, task) -> None:
    """Checkpoints hold the weights the task names (all, or a LoRA adapter's), unwrapped, so
    a run saved by N processes resumes on M; Accelerate saves and loads everything else."""
    from accelerate.utils import extract_model_from_parallel as unwrap
    from safetensors.torch import load_file

    # The hooks must not hold the accelerator: it holds them, and the cycle would keep the
    # DataLoaders (and their worker processes) alive after fit returns.
    def save_weights(models, weights, output_dir):
        for i, model in enumerate(models[:len(weights)]):  # FSDP saves its own shards: no weights
            weights[i] = task.model_state(unwrap(model))

    def load_weights(models, input_dir):
        for i, model in enumerate(models):
            name = "model.safetensors" if i == 0 else f"model_{i}.safetensors"
            task.load_model_state(unwrap(model), load_file(Path(input_dir) / name))
        models.clear()  # loaded: Accelerate must not load them again

    accelerator.register_save_state_pre_hook(save_weights)
    accelerator.register_load_state_pre_hook(load_weights)


def save_model(accelerator, task, model, tokenizer, directory: Path, extra: dict | None = None, *,
               run_dir: Path | None = None) -> Path:
    """The task's final (or best) model, written atomically by the main process. Call on every process.

    ``run_dir``: the run folder, whose record and events the model card (README.md) is written
    from, inside the same atomic save."""
    acc = accelerator
    state_dict = acc.get_state_dict(model)  # every process: FSDP gathers the shards
    if acc.is_main_process:
        def write(tmp: Path) -> None:
            with no_hf_progress_bars():  # "Writing model shards" bars: noise in logs and cells
                task.save_model(acc.unwrap_model(model), tokenizer, tmp, state_dict)
            if extra:
                (tmp / "best.json").write_text(json.dumps(extra, indent=2) + "\n", encoding="utf-8")
            if run_dir is not None:
                safe_write_card(tmp, run_dir, kind=Path(directory).name, extra=extra, location=directory)

        write_dir_atomically(directory, write)
    acc.wait_for_everyone()
    return directory


def carded_writer(run_dir: Path) -> Callable[[Path, Callable[[Path], None]], Path]:
    """:func:`write_dir_atomically` that also writes the model card into the folder: what the
    engine hands to ``task.finish`` (a merged model gets its card; the task knows nothing of it)."""
    def write_dir(final: Path, write: Callable[[Path], None]) -> Path:
        def write_with_card(tmp: Path) -> None:
            write(tmp)
            safe_write_card(tmp, run_dir, kind=Path(final).name, location=final)

        return write_dir_atomically(final, write_with_card)

    return write_dir


def write_run_record(output_dir: str | os.PathLike, record: dict[str, Any]) -> Path:
    """The run record at the top of the run folder (``run.json``), replaced atomically at each start:
    what the model card, ``workbench.evaluate`` and ``workbench export`` read about the run."""
    path = Path(output_dir) / RUN_RECORD
    tmp = path.with_name(f".{RUN_RECORD}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


@contextlib.contextmanager
def no_hf_progress_bars():
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
