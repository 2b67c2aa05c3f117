"""The files a sweep keeps: ``<root>/sweep.json`` (the plan) and ``<combination>/sweep-status.json``.

The plan is what every runner of the sweep reads (this machine, or each Slurm array task):
the notebook, the combinations and the parameters. A combination's status file says
``running`` (with the process), then ``completed`` or ``failed`` (with the error); it is
written atomically (a rename), so a kill never leaves half of one, and ``completed`` is
final: no later ``running`` or ``failed`` (a runner that lost a race) replaces it. Running the sweep
again skips the ``completed`` combinations and runs the others, whose fit resumes from
its checkpoints.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workbench.engine.safe_read import read_text_bounded
from workbench.errors import WorkbenchError
from workbench.sweep.grid import Combination

PLAN_FILE = "sweep.json"
MAX_PLAN_BYTES = 64 << 20  # a plan of a million combinations is ~100 MB; nobody sweeps that
STATUS_FILE = "sweep-status.json"


@dataclass
class Plan:
    name: str
    root: str  # outputs/<name>, absolute
    notebook: str  # absolute
    grid: dict[str, list[Any]]
    parameters: dict[str, Any]  # the same in every combination
    combinations: list[Combination]
    kernel: str = "python3"
    output_parameter: str | None = "output_dir"  # the notebook parameter that receives the folder
    cell_timeout_s: int | None = None
    env: dict[str, str] = field(default_factory=dict)  # extra environment for the kernels

    @property
    def root_path(self) -> Path:
        return Path(self.root)

    def folder(self, combination: Combination) -> Path:
        return self.root_path / combination.name

    def parameters_of(self, combination: Combination) -> dict[str, Any]:
        values = {**self.parameters, **combination.parameters}
        if self.output_parameter:
            values[self.output_parameter] = str(self.folder(combination))
        return values

    def save(self) -> Path:
        self.root_path.mkdir(parents=True, exist_ok=True)
        data = asdict(self)
        return write_json(self.root_path / PLAN_FILE, data)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Plan:
        path = Path(path)
        if path.is_dir():
            path = path / PLAN_FILE
        try:
            data = json.loads(read_text_bounded(path, MAX_PLAN_BYTES))
        except (OSError, ValueError) as exc:
            raise WorkbenchError(f"Cannot read the sweep plan {path}: {exc}.",
                                 "run `workbench sweep NOTEBOOK --grid ...` first; it writes the plan.") from None
        data["combinations"] = [Combination(**c) for c in data["combinations"]]
        return cls(**data)


def write_json(path: Path, data: dict) -> Path:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_status(folder: Path) -> dict[str, Any]:
    try:
        # Bounded, regular files only: a FIFO here must not hang the sweep (engine/safe_read.py).
        status = json.loads(read_text_bounded(folder / STATUS_FILE, 1 << 20))
    except (OSError, ValueError):
        return {}
    return status if isinstance(status, dict) else {}


def write_status(folder: Path, status: str, **fields) -> dict[str, Any]:
    """Record ``status``; returns the record now in the file (a ``completed`` one is never replaced)."""
    folder.mkdir(parents=True, exist_ok=True)
    current = read_status(folder)
    if current.get("status") == "completed" and status != "completed":
        return current
    record = {"status": status, "time": round(time.time(), 3), "host": socket.gethostname(),
              "pid": os.getpid(), **fields}
    write_json(folder / STATUS_FILE, record)
    return record
