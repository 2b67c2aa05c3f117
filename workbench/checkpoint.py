"""Atomic checkpoints that hold everything needed to continue a run exactly.

Layout under ``<output_dir>/checkpoints/``::

    step-000120/   model.pt optimizer.pt scheduler.pt [scaler.pt] rng.pt state.json run.json manifest.json

A checkpoint is written into ``.tmp-step-000120-<pid>/``, every file fsynced,
``manifest.json`` (file names and sizes) written last, then the folder is renamed
into place and the parent fsynced. A crash or ``kill -9`` at any moment leaves either
the previous checkpoints untouched or a dot-folder that is never chosen: only folders
whose manifest matches their files count as valid.
"""

from __future__ import annotations

import json
import os
import platform
import random
import re
import shutil
import sys
import time
import warnings
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workbench.errors import CheckpointError

CHECKPOINTS = "checkpoints"
MANIFEST = "manifest.json"
STATE = "state.json"
RUN_RECORD = "run.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")
FORMAT = 1

# Test-only hook: pause inside a save (after the first file) so a test can kill -9 the
# process mid-save. WORKBENCH_TEST_SAVE_PAUSE="<step>:<seconds>:<flag file to touch>".
_PAUSE_ENV = "WORKBENCH_TEST_SAVE_PAUSE"


def checkpoints_dir(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / CHECKPOINTS


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


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
    old = None
    try:
        write(tmp)
        for path in tmp.rglob("*"):
            if path.is_file():
                _fsync_path(path)
        _fsync_path(tmp)
        if final.exists():
            old = final.parent / f".old-{final.name}-{os.getpid()}"
            if old.exists():
                shutil.rmtree(old)
            os.rename(final, old)
        os.rename(tmp, final)
        _fsync_path(final.parent)
    except BaseException:
        if old is not None and old.exists() and not final.exists():
            # The second rename failed (or was interrupted): put the old copy back rather
            # than leave no ``final`` at all.
            os.rename(old, final)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


_LEFTOVER = re.compile(r"^\.(?P<kind>tmp|old)-(?P<name>.+)-(?P<pid>\d+)$")


def _leftovers(directory: Path) -> list[tuple[str, str, Path]]:
    """(kind, name, path) of the ``.tmp-<name>-<pid>`` / ``.old-<name>-<pid>`` folders."""
    found = []
    for path in directory.iterdir():
        match = _LEFTOVER.match(path.name)
        if match and path.is_dir():
            found.append((match.group("kind"), match.group("name"), path))
    return found


def remove_stale_temporaries(directory: Path) -> list[str]:
    """Clean up after a save that crashed; returns what was recovered, as messages to log.

    ``.tmp-*`` folders are half-written and removed. An ``.old-<name>-*`` folder is
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


# ------------------------------------------------------------- save / find / load
def _maybe_pause(tmp: Path, step: int) -> None:
    spec = os.environ.get(_PAUSE_ENV)
    if not spec:
        return
    pause_step, seconds, flag = spec.split(":", 2)
    if int(pause_step) == step:
        Path(flag).write_text(str(tmp))
        time.sleep(float(seconds))


def save_checkpoint(output_dir: str | os.PathLike, step: int, objects: dict[str, Any],
                    state: dict[str, Any], record: dict[str, Any], keep: int | None = None) -> Path:
    """Write ``objects`` (name -> torch-serialisable) plus state and run record, atomically.

    ``keep``: afterwards delete all but the newest ``keep`` step checkpoints.
    """
    root = checkpoints_dir(output_dir)

    def write(tmp: Path) -> None:
        files = {}
        for i, (name, obj) in enumerate(objects.items()):
            torch.save(obj, tmp / f"{name}.pt")
            files[f"{name}.pt"] = (tmp / f"{name}.pt").stat().st_size
            if i == 0:
                _maybe_pause(tmp, step)
        for name, data in ((STATE, state), (RUN_RECORD, record)):
            (tmp / name).write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
            files[name] = (tmp / name).stat().st_size
        manifest = {"format": FORMAT, "step": step, "files": files, "complete": True}
        # Written last: its presence (and matching sizes) is what makes the folder valid.
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")

    try:
        path = write_dir_atomically(root / step_dir_name(step), write)
    except OSError as exc:
        raise CheckpointError(f"Could not write checkpoint for step {step} in {root}: {exc}.",
                              "free disk space or choose another output_dir.") from exc
    if keep is not None:
        prune(output_dir, keep)
    return path


def validate(path: Path) -> str | None:
    """None when ``path`` is a complete checkpoint, else why not."""
    manifest_path = Path(path) / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "no readable manifest.json (the save did not finish)"
    if not manifest.get("complete"):
        return "manifest not marked complete"
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


def latest_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    found = list_checkpoints(output_dir, warn=True)
    return found[-1] if found else None


def prune(output_dir: str | os.PathLike, keep: int) -> None:
    for path in list_checkpoints(output_dir)[:-keep]:
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


def load_checkpoint(path: Path, names: tuple[str, ...]) -> tuple[dict[str, Any], dict, dict]:
    """(objects by name, state, run record). Objects are loaded onto the CPU."""
    objects = {}
    for name in names:
        file = Path(path) / f"{name}.pt"
        if file.is_file():
            # rng.pt holds numpy/python RNG tuples, which weights_only loading refuses;
            # these files are our own, written by save_checkpoint.
            objects[name] = torch.load(file, map_location="cpu", weights_only=(name != "rng"))
    state = json.loads((Path(path) / STATE).read_text(encoding="utf-8"))
    record = json.loads((Path(path) / RUN_RECORD).read_text(encoding="utf-8"))
    return objects, state, record
