"""Key results of a notebook, stored in the notebook itself so a harness can read them back.

``record("eval_accuracy", 0.91)`` in a notebook cell publishes a display output
with two representations:

* ``application/vnd.workbench.record+json``: ``{"name": ..., "value": ...}``,
  which `workbench regress` reads from the executed ``.ipynb`` (``read_records``);
* ``text/plain``: one readable line, which is what JupyterLab shows (it has no
  renderer for the custom type and falls back to the plain text).

Outside a Jupyter kernel (a script, ``torchrun``, a test) nothing can hold a
display output, so ``record`` only logs the value.

Values must be JSON: numbers, strings, bools, None and small lists/dicts of
them. NaN and infinities are not JSON; they are recorded as ``null`` on purpose
so that the comparison with a baseline fails loudly instead of the notebook
crashing in its last cell.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workbench.engine.runtime import in_jupyter_kernel
from workbench.errors import WorkbenchError

MIMETYPE = "application/vnd.workbench.record+json"
# A record is a key result, not a data dump: the executed notebook must stay small.
MAX_RECORD_BYTES = 64 * 1024

log = logging.getLogger("workbench.record")


def record(name: str, value: Any) -> Any:
    """Store ``value`` under ``name`` in the executing notebook's outputs; return ``value``.

    A later ``record`` of the same name replaces the earlier one when read back.
    """
    if not isinstance(name, str) or not name.strip():
        raise WorkbenchError(
            f"record() needs a non-empty string name, got {name!r}.",
            'Call it as record("eval_accuracy", value).',
        )
    clean = _to_json_value(value, name)
    payload = {"name": name, "value": clean}
    size = len(json.dumps(payload))
    if size > MAX_RECORD_BYTES:
        raise WorkbenchError(
            f"record({name!r}, ...) is {size} bytes of JSON; records are limited to "
            f"{MAX_RECORD_BYTES} bytes.",
            "Record a summary (a final metric, a count) and save large results to a file.",
        )
    text = f"workbench.record: {name} = {json.dumps(clean)}"
    if in_jupyter_kernel():
        # Imported here: IPython is only needed (and only present) inside a kernel.
        from IPython.display import display

        display({MIMETYPE: payload, "text/plain": text}, raw=True)
    else:
        log.info(text)
    return value


def read_records(notebook: str | Path | Mapping) -> dict[str, Any]:
    """The records of an executed notebook (a path or an ``nbformat`` node), name -> value."""
    if isinstance(notebook, (str, Path)):
        with open(notebook, encoding="utf-8") as f:
            notebook = json.load(f)
    records: dict[str, Any] = {}
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []) or []:
            payload = (output.get("data") or {}).get(MIMETYPE)
            if isinstance(payload, str):  # some writers store JSON mimetypes as text
                payload = json.loads(payload)
            if isinstance(payload, Mapping) and "name" in payload:
                records[payload["name"]] = payload.get("value")
    return records


def _to_json_value(value: Any, name: str) -> Any:
    """``value`` as plain JSON data; numpy/torch scalars become Python numbers, NaN -> None."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _to_json_value(v, name) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json_value(v, name) for v in value]
    # numpy scalars/arrays and torch tensors, without importing either.
    for convert in ("item", "tolist"):
        method = getattr(value, convert, None)
        if callable(method):
            try:
                return _to_json_value(method(), name)
            except (TypeError, ValueError, RuntimeError):
                continue
    raise WorkbenchError(
        f"record({name!r}, ...) got a {type(value).__name__}, which cannot be stored as JSON.",
        "Record a number, string, bool, or a small list/dict of them (e.g. float(x)).",
    )
