"""What a chat template does, found by rendering it: the text around each role, the system prompt
it adds by itself, and the token that ends a turn.

Ollama's TEMPLATE is a Go template, not Jinja, and a model whose exported template or stop
tokens are wrong answers with gibberish or never stops: the most reported failure of GGUF
exports. Translating Jinja is not possible in general, but what a chat template *produces* can
be measured: render conversations with marker strings in place of the contents, and the text
between the markers is each role's opening and closing. That holds for every template that
renders each turn as a prefix of the next (the same rule the training's loss mask relies on,
``workbench.tasks.causal_lm.assistant_spans``); a template that does not is reported, and the
Modelfile then leaves the template to the one inside the GGUF file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Marker contents: plain words no template rewrites (no whitespace to strip, no special characters).
SYSTEM, USER, ASSISTANT, USER2 = "WBSYSTEMMARKER", "WBUSERMARKER", "WBASSISTANTMARKER", "WBUSERTWOMARKER"


@dataclass
class TemplateShape:
    """A chat template as the text around each role's content."""

    system_prefix: str = ""
    system_suffix: str = ""
    user_prefix: str = ""
    user_suffix: str = ""
    assistant_prefix: str = ""  # what add_generation_prompt=True appends (the model's turn header)
    assistant_suffix: str = ""  # what closes an assistant turn (its end-of-turn token, a newline...)
    default_system: str | None = None  # the system prompt the template writes when none is given
    supports_system: bool = True
    leading: str = ""  # text the template writes before the first turn (a BOS token, say)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def render(tokenizer, messages: list[dict], generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def analyse(tokenizer) -> TemplateShape:
    """The shape of ``tokenizer.chat_template`` (``problems`` lists why it could not be measured)."""
    shape = TemplateShape()
    if not getattr(tokenizer, "chat_template", None):
        shape.problems.append("the tokenizer has no chat template")
        return shape
    user = [{"role": "user", "content": USER}]
    turn = [*user, {"role": "assistant", "content": ASSISTANT}]
    try:
        plain_user = render(tokenizer, user)
        prompt = render(tokenizer, user, generation_prompt=True)
        one_turn = render(tokenizer, turn)
        two_turns = render(tokenizer, [*turn, {"role": "user", "content": USER2}])
    except Exception as exc:  # noqa: BLE001 - jinja2 errors, raise_exception() in the template
        shape.problems.append(f"the template fails on a plain user/assistant conversation ({exc})")
        return shape
    if not (prompt.startswith(plain_user) and one_turn.startswith(plain_user) and two_turns.startswith(one_turn)):
        shape.problems.append("the template does not render each turn as a prefix of the next")
        return shape
    shape.assistant_prefix = prompt[len(plain_user):]
    head, _, shape.user_suffix = plain_user.partition(USER)
    answer = one_turn[len(plain_user):]
    if ASSISTANT not in answer or not answer.startswith(shape.assistant_prefix):
        shape.problems.append("the assistant's turn does not start with the generation prompt")
        return shape
    shape.assistant_suffix = answer.partition(ASSISTANT)[2]
    shape.user_prefix = two_turns[len(one_turn):].partition(USER2)[0]
    if not head.endswith(shape.user_prefix):
        shape.problems.append("the first user turn opens differently from the next ones")
        return shape
    before_first_user = head[:len(head) - len(shape.user_prefix)]
    _system_parts(tokenizer, shape, user, before_first_user)
    return shape


def _system_parts(tokenizer, shape: TemplateShape, user: list[dict], before_first_user: str) -> None:
    """The system turn's opening and closing, the default system prompt, and any leading text."""
    try:
        with_system = render(tokenizer, [{"role": "system", "content": SYSTEM}, *user])
    except Exception:  # noqa: BLE001 - templates that refuse a system role (some Mistral/Gemma ones)
        shape.supports_system = False
        shape.leading = before_first_user
        return
    if SYSTEM not in with_system:
        shape.supports_system = False
        shape.leading = before_first_user
        return
    head, _, tail = with_system.partition(SYSTEM)
    user_turn = shape.user_prefix + USER
    shape.system_suffix = tail[:tail.index(user_turn)] if user_turn in tail else ""
    # Before the first user turn there is the text every conversation starts with (a BOS some
    # templates write), then the template's own system turn when it adds one by itself.
    rest, suffix = before_first_user, shape.system_suffix
    if suffix and rest.startswith(head) and rest.endswith(suffix) and len(rest) > len(head) + len(suffix):
        shape.default_system = rest[len(head):len(rest) - len(suffix)]
        shape.system_prefix = head
    else:
        shape.leading = rest if head.startswith(rest) else ""
        shape.system_prefix = head[len(shape.leading):]


def end_of_turn_id(tokenizer, shape: TemplateShape) -> int | None:
    """The id of the special token that closes an assistant turn (``<|im_end|>``, ``<|eot_id|>``...):
    the first special token of the assistant suffix; the EOS when the suffix has none."""
    if shape.assistant_suffix:
        ids = tokenizer(shape.assistant_suffix, add_special_tokens=False)["input_ids"]
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        added = {i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if getattr(t, "special", False)}
        for token_id in ids:
            if token_id in special or token_id in added:
                return int(token_id)
    return tokenizer.eos_token_id


def stop_strings(tokenizer, shape: TemplateShape, eot_id: int | None) -> list[str]:
    """What should stop generation: the end-of-turn token, the EOS, and the next turn's opening
    when it starts with a special token (a model that skips its end token stops there)."""
    stops = []
    for token_id in (eot_id, tokenizer.eos_token_id):
        if token_id is not None:
            text = tokenizer.convert_ids_to_tokens(int(token_id))
            if text and text not in stops:
                stops.append(text)
    opening = shape.user_prefix.strip()
    if opening and opening not in stops and opening in (tokenizer.get_added_vocab() or {}):
        stops.append(opening)
    return stops
