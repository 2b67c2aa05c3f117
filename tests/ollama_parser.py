"""A port of Ollama's Modelfile parser (``parser/parser.go``: ``ParseFile``, ``parseRuneForState``,
``unquote``), rune for rune, to read back what ``workbench export`` writes exactly as Ollama would.

Used by tests/test_modelfile.py and by the generated-files registry (tests/test_generated_files.py).
"""

from __future__ import annotations


def _is_space(r):
    return r in " \t"


def _is_newline(r):
    return r in "\r\n"


def _unquote(s: str):
    if len(s) >= 3 and s[:3] == '"""':
        return (s[3:-3], True) if len(s) >= 6 and s[-3:] == '"""' else ("", False)
    if len(s) >= 1 and s[0] == '"':
        return (s[1:-1], True) if len(s) >= 2 and s[-1] == '"' else ("", False)
    return s, True


def _next_state(r: str, state: str) -> tuple[str, str | None]:
    """parseRuneForState: (next state, the rune to keep or None)."""
    if state == "nil":
        return ("comment", None) if r == "#" else ("nil", None) if (_is_space(r) or _is_newline(r)) else ("name", r)
    if state == "name":
        if r.isascii() and r.isalpha():
            return "name", r
        assert _is_space(r), f"invalid command character {r!r}"
        return "value", None
    if state == "value":
        return ("nil", r) if (_is_newline(r) or _is_space(r)) else ("value", r)
    if state == "parameter":
        if r.isascii() and (r.isalnum() or r == "_"):
            return "parameter", r
        assert _is_space(r), f"invalid parameter character {r!r}"
        return "value", None
    return ("nil", None) if _is_newline(r) else ("comment", None)  # comment


def parse_modelfile(text: str) -> list[tuple[str, str]]:
    """(command, value) pairs as Ollama's parser.ParseFile reads them (Go's IsPrint ~ str.isprintable)."""
    commands, name, buffer, state = [], "", [], "nil"
    for char in text:
        nxt, r = _next_state(char, state)
        if nxt != state:
            if state == "name":
                word = "".join(buffer).lower()
                assert word in ("from", "template", "system", "parameter", "license", "adapter", "message"), word
                if word == "parameter":
                    nxt = "parameter"
                name = "model" if word == "from" else word
            elif state == "parameter":
                name = "".join(buffer)
            elif state == "value":
                value, ok = _unquote("".join(buffer).strip())
                if not ok or _is_space(r):
                    buffer.append(r)  # the value goes on: this rune is part of it
                    continue
                commands.append((name, value))
            buffer, state = [], nxt
        if r is not None and r.isprintable():
            buffer.append(r)
    if state == "value":
        value, ok = _unquote("".join(buffer).strip())
        assert ok, "unterminated value"
        commands.append((name, value))
    else:
        assert state in ("nil", "comment"), f"the file ends inside a {state}"
    return commands
