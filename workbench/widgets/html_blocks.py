"""The HTML pieces every picker view writes: error boxes, coloured notes, a preview table.

One place for them so an error reads the same in each widget: what went wrong, then
"What to do", and never a traceback.
"""

from __future__ import annotations

import html
from typing import Any

from workbench.errors import WorkbenchError

WARNING = "#8a6d00"  # amber: a note that asks for a choice, not an error
ERROR = "#b00020"


def error_html(error: BaseException) -> str:
    if isinstance(error, WorkbenchError):
        fix = f"<br><b>What to do:</b> {html.escape(error.fix)}" if error.fix else ""
        return (f"<div style='color:{ERROR}'><b>Error:</b> "
                f"{html.escape(error.message).replace(chr(10), '<br>')}{fix}</div>")
    # not one of ours: still one readable line, never a traceback
    return (f"<div style='color:{ERROR}'><b>Unexpected error</b> ({type(error).__name__}): "
            f"{html.escape(str(error))}<br><b>What to do:</b> check the inputs above; if they look"
            " right, report this with the message.</div>")


def note_html(text: str, color: str = "#333") -> str:
    return f"<div style='color:{color}'>{html.escape(text).replace(chr(10), '<br>')}</div>"


def table_html(rows: list[dict[str, Any]], columns: list[str], types: dict[str, str]) -> str:
    def cell(value: Any) -> str:
        text = str(value)
        return html.escape(text if len(text) <= 80 else text[:77] + "...")

    head = "".join(f"<th>{html.escape(c)}<br><small>{html.escape(types.get(c, ''))}</small></th>"
                   for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{cell(r.get(c))}</td>" for c in columns) + "</tr>"
                   for r in rows)
    return f"<table class='wb-preview'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
