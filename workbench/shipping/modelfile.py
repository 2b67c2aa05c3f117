"""The Ollama ``Modelfile`` written beside a GGUF export: FROM, TEMPLATE, SYSTEM and the stop tokens.

``ollama create NAME -f Modelfile`` reads it, so it is a file another program parses and every
value written into it is quoted the way Ollama's parser (``parser/parser.go``) reads it back:
each value goes between triple quotes, which that parser takes verbatim (no escapes) and ends
only at a line that closes them. A value that cannot be quoted so (it holds ``\"\"\"`` itself,
or a control character the parser drops) is refused with the reason, never written altered.

TEMPLATE is a Go template built from the measured shape of the run's Jinja chat template
(``chat_template.py``): the same text around each role, the generation prompt after the last
user turn, no end-of-turn token after the answer being generated (the model writes it). Its
structure follows Ollama's own templates for chat models (``.System``, then a ``range`` over
``.Messages``). SYSTEM is the run's system prompt when it trained with one, else the default
the template writes by itself (SmolLM2's, Qwen2.5's), so Ollama's prompt equals the
template's when no system message is given.
"""

from __future__ import annotations

import re

from workbench.errors import ExportError
from workbench.shipping.chat_template import TemplateShape

MODELFILE = "Modelfile"


def quote(value: str, what: str) -> str:
    """``value`` between triple quotes, as Ollama's Modelfile parser reads it back unchanged."""
    if '"""' in value:
        raise ExportError(f"The {what} contains three double quotes in a row (\"\"\"), which an Ollama "
                          "Modelfile cannot hold: its parser ends the value there.",
                          f"change the {what} (e.g. use single quotes), or write the Modelfile by hand.")
    # Ollama's parser keeps only what Go's unicode.IsPrint accepts (as str.isprintable does),
    # plus the tabs and line breaks between words: anything else would vanish from the value.
    bad = next((c for c in value if c not in "\t\r\n" and not c.isprintable()), None)
    if bad is not None:
        raise ExportError(f"The {what} contains the invisible character {bad!r} (U+{ord(bad):04X}), which Ollama's "
                          "Modelfile parser silently drops.", f"remove it from the {what}.")
    return f'"""{value}"""'


def go_literal(text: str) -> str:
    """Literal text inside a Go template: only ``{{`` has a meaning there, written as an action."""
    return text.replace("{{", '{{ "{{" }}')


def go_template(shape: TemplateShape, *, drop_leading: str = "") -> str:
    """The Go template equivalent of ``shape``. ``drop_leading``: a BOS text the template writes
    itself but llama.cpp adds as a token anyway (a second BOS would shift every prediction)."""
    lit = go_literal
    leading = shape.leading.removeprefix(drop_leading) if drop_leading else shape.leading
    system_prefix = shape.system_prefix
    if drop_leading and not shape.leading and system_prefix.startswith(drop_leading):
        system_prefix = system_prefix[len(drop_leading):]
    parts = [lit(leading)]
    if shape.supports_system:
        parts.append(f"{{{{ if .System }}}}{lit(system_prefix)}{{{{ .System }}}}{lit(shape.system_suffix)}{{{{ end }}}}")
    parts.append(
        "{{ range $i, $_ := .Messages }}"
        "{{ $last := eq (len (slice $.Messages $i)) 1 }}"
        f'{{{{ if eq .Role "user" }}}}{lit(shape.user_prefix)}{{{{ .Content }}}}{lit(shape.user_suffix)}'
        f'{{{{ else if eq .Role "assistant" }}}}{lit(shape.assistant_prefix)}{{{{ .Content }}}}'
        f"{{{{ if not $last }}}}{lit(shape.assistant_suffix)}{{{{ end }}}}"
        "{{ end }}"
        f'{{{{ if and $last (ne .Role "assistant") }}}}{lit(shape.assistant_prefix)}{{{{ end }}}}'
        "{{ end }}")
    return "".join(parts)


def render_like_ollama(shape: TemplateShape, system: str | None, messages: list[dict], *,
                       drop_leading: str = "") -> str:
    """What :func:`go_template` produces for ``messages`` (user/assistant turns) with ``.System``
    = ``system``, computed in Python: the tests compare it with the Jinja template's own output."""
    leading = shape.leading.removeprefix(drop_leading) if drop_leading else shape.leading
    system_prefix = shape.system_prefix
    if drop_leading and not shape.leading and system_prefix.startswith(drop_leading):
        system_prefix = system_prefix[len(drop_leading):]
    out = [leading]
    if shape.supports_system and system:
        out.append(system_prefix + system + shape.system_suffix)
    for i, m in enumerate(messages):
        last = i == len(messages) - 1
        if m["role"] == "user":
            out.append(shape.user_prefix + m["content"] + shape.user_suffix)
        elif m["role"] == "assistant":
            out.append(shape.assistant_prefix + m["content"] + ("" if last else shape.assistant_suffix))
        if last and m["role"] != "assistant":
            out.append(shape.assistant_prefix)
    return "".join(out)


def modelfile_text(gguf_name: str, *, shape: TemplateShape | None, system: str | None, stops: list[str],
                   title: str, drop_leading: str = "", context_length: int | None = None) -> str:
    """The Modelfile: FROM the GGUF beside it, TEMPLATE, SYSTEM, the stop parameters.

    ``shape`` None (a template that could not be measured): no TEMPLATE line; Ollama then uses
    the template stored in the GGUF file.
    """
    comment = re.sub(r"[\r\n]+", " ", title)
    lines = [f"# {comment}",
             "# ollama create NAME -f Modelfile && ollama run NAME   (written by `workbench export`)",
             f"FROM {quote('./' + gguf_name, 'file name')}"]
    if shape is not None and shape.ok:
        lines.append(f"TEMPLATE {quote(go_template(shape, drop_leading=drop_leading), 'chat template')}")
    if system:
        lines.append(f"SYSTEM {quote(system, 'system prompt')}")
    for stop in stops:
        lines.append(f"PARAMETER stop {quote(stop, 'stop token')}")
    if context_length:
        lines.append(f"PARAMETER num_ctx {int(context_length)}")
    return "\n".join(lines) + "\n"
