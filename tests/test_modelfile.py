"""The Ollama Modelfile and the chat-template shape it is built from (workbench/shipping/modelfile.py,
chat_template.py).

The Modelfile is a file another program parses, so it is read back here with a port of Ollama's
own parser (``parser/parser.go``: ``ParseFile``, ``parseRuneForState``, ``unquote``), rune for
rune: every value must come back exactly as written. The TEMPLATE's text around each role is
checked against the Jinja template by rendering the same conversations both ways.
"""

from __future__ import annotations

import pytest

from workbench.errors import ExportError
from workbench.shipping.chat_template import analyse, end_of_turn_id, stop_strings
from workbench.shipping.modelfile import go_template, modelfile_text, quote, render_like_ollama


# --------------------------------------------------------------------------- Ollama's parser, ported
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


def test_the_port_reads_ollamas_own_examples():
    text = 'FROM llama3.2\nPARAMETER temperature 1\nSYSTEM """You are Mario.\nBe brief."""\n# a comment\n'
    assert parse_modelfile(text) == [("model", "llama3.2"), ("temperature", "1"),
                                     ("system", "You are Mario.\nBe brief.")]


@pytest.mark.parametrize("value", [
    'He said "hi"',  # quotes inside
    'ends with a quote"',
    '"starts with one',
    "  leading and trailing spaces  ",
    "two\nlines\n\nwith a blank one\n",
    'the first line ends with "a quote"\nand the value goes on',  # ends a "..." value early
    '"a quoted line"\n"and another"',
    "# not a comment\nFROM not a command",
    "tabs\tinside",
    "{{ .System }} and {{ braces }}",
    "ünïcödé ✅ 🦙",
])
def test_every_value_comes_back_as_written(value):
    text = modelfile_text("m.gguf", shape=None, system=value, stops=[value], title="t\nwith a newline")
    parsed = parse_modelfile(text)
    assert ("model", "./m.gguf") in parsed
    assert ("system", value) in parsed and ("stop", value) in parsed


@pytest.mark.parametrize("value, problem", [('say """hi"""', "three double quotes"), ("bell\x07", "invisible character"), ("zero\u200dwidth", "invisible character")])
def test_a_value_ollama_cannot_hold_is_refused_not_altered(value, problem):
    with pytest.raises(ExportError, match=problem) as caught:
        quote(value, "system prompt")
    assert "system prompt" in caught.value.fix


# --------------------------------------------------------------------------- the template's shape
CONVERSATIONS = [
    [{"role": "user", "content": "Hi there"}],
    [{"role": "user", "content": "One"}, {"role": "assistant", "content": "Two"}, {"role": "user", "content": "Three"}],
]


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture
def tokenizer(smollm2_tokenizer):
    """SmolLM2's tokenizer; a test may set another chat template on it, put back after."""
    template = smollm2_tokenizer.chat_template
    yield smollm2_tokenizer
    smollm2_tokenizer.chat_template = template


def _jinja(tokenizer, system, messages):
    full = ([{"role": "system", "content": system}] if system else []) + messages
    return tokenizer.apply_chat_template(full, tokenize=False, add_generation_prompt=True)


def test_a_template_with_its_own_system_prompt(tokenizer):
    """SmolLM2's template writes a system prompt when none is given: the Modelfile's SYSTEM is that prompt,
    so Ollama's default conversation is the template's, token for token."""
    shape = analyse(tokenizer)
    assert shape.ok and shape.default_system == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    for messages in CONVERSATIONS:
        assert render_like_ollama(shape, shape.default_system, messages) == _jinja(tokenizer, None, messages)
        assert render_like_ollama(shape, "Be terse.", messages) == _jinja(tokenizer, "Be terse.", messages)
    eot = end_of_turn_id(tokenizer, shape)
    assert tokenizer.convert_ids_to_tokens(eot) == "<|im_end|>"
    assert stop_strings(tokenizer, shape, eot) == ["<|im_end|>"]


def test_other_template_forms(tokenizer):
    from workbench.tasks.causal_lm_data import SIMPLE_TEMPLATE

    llama3 = ("{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n'"
              " + m['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
              "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
    no_system = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system') }}{% endif %}"
                 "[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}")
    for template, system in ((SIMPLE_TEMPLATE, "Be terse."), (llama3, "Be terse."), (no_system, None)):
        tokenizer.chat_template = template
        shape = analyse(tokenizer)
        assert shape.ok, shape.problems
        assert shape.supports_system == (system is not None)
        for messages in CONVERSATIONS:
            assert render_like_ollama(shape, system, messages) == _jinja(tokenizer, system, messages)
    # A BOS the template writes but llama.cpp adds as a token anyway is left out of the Go template.
    tokenizer.chat_template = llama3
    shape = analyse(tokenizer)
    assert shape.leading == tokenizer.bos_token
    assert not go_template(shape, drop_leading=tokenizer.bos_token).startswith(tokenizer.bos_token)


def test_a_template_that_cannot_be_measured_leaves_the_template_to_the_gguf(tokenizer):
    tokenizer.chat_template = "{{ messages | length }} messages"  # renders no content at all
    shape = analyse(tokenizer)
    assert not shape.ok
    text = modelfile_text("m.gguf", shape=shape, system=None, stops=["<|im_end|>"], title="t")
    assert "TEMPLATE" not in text and ("stop", "<|im_end|>") in parse_modelfile(text)


def test_the_go_template_is_what_ollama_parses_back(tokenizer):
    shape = analyse(tokenizer)
    template = go_template(shape)
    text = modelfile_text("m.gguf", shape=shape, system=shape.default_system, stops=["<|im_end|>"], title="t")
    assert ("template", template) in parse_modelfile(text)
    # Literal "{{" in a role's text is written as a Go action that prints it.
    shape.user_prefix = "{{user}}"
    assert '{{ "{{" }}user}}' in go_template(shape)
