"""One notebook of a regression run, and where everything about it goes.

Its own module because both the runner (which runs it) and ``outcome`` (which judges
what happened) need it, and the runner imports ``outcome``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Task:
    """One notebook to run and where everything about it goes."""

    notebook: str
    input_path: Path
    parameters: dict[str, Any]
    executed_path: Path
    log_path: Path
    spec_path: Path
    result_path: Path
    scratch_dir: Path
