"""A causal LM's data: the row formats and their checks, chat-template rendering, the loss mask, batches.

What ``CausalLMTask`` (``causal_lm.py``) reads rows with; no model, no loss, no saving here.

**Formats.** Three row formats, found from the columns (``data_format="auto"``):
``messages`` (a list of ``{role, content}``), ``prompt`` + ``completion`` columns,
or one ``text`` column (plain language modelling). Chats and pairs are rendered
by the tokenizer's own chat template; a tokenizer without one is refused unless
``chat_template`` names the simple built-in template (``SIMPLE_TEMPLATE``) or gives a
Jinja template. Messages are accepted as users hand them over (ShareGPT's from/value,
OpenAI's content parts and weights) and normalized; a row that cannot be trained on is
named with the reason (``row_problem``).

**Labels.** With ``loss_on="completion"`` only the assistant's tokens carry loss,
up to and including the end-of-turn token (so the model learns to stop); the
prompt, the system message, the template's role markers, what follows the
end-of-turn token and the padding are -100. Which characters belong to an
assistant turn is found by rendering the conversation up to each assistant
message with and without it, which holds for any template that renders each turn
as a prefix of the next. The text is cut at those boundaries and the pieces are
tokenized apart, so the prompt's tokens are those the model sees at inference
(no token merges the role header with the answer). An EOS is appended where the
template puts none.
``loss_on="all"`` trains on every non-padding token.

**Batches.** Rows are tokenized once, unpadded (``CausalLMDataset``); batches are padded
to their own longest row (``PaddingCollator``: right padding, labels -100, attention mask 0).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset

from workbench.config import TrainConfig
from workbench.errors import DataError
from workbench.sources.data_files import RowLocator

IGNORE = -100  # label of a token that carries no loss (PyTorch cross_entropy's ignore_index)
ROLES = ("system", "user", "assistant")
CHECK_ROWS_SHOWN = 3  # bad rows named in a DataError

# A template for tokenizers that have none (base models): plain-text role headers,
# EOS after each answer so the model learns to stop. Chosen with chat_template="simple".
SIMPLE_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}\n\n"
    "{% elif message['role'] == 'user' %}### User:\n{{ message['content'] }}\n\n"
    "{% else %}### Assistant:\n{{ message['content'] }}{{ eos_token }}\n\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}### Assistant:\n{% endif %}"
)


# ---------------------------------------------------------------------- data checks
def detect_format(columns: Sequence[str], settings: TrainConfig) -> str:
    """messages, prompt_completion or text, from the columns present (or as the settings say)."""
    if settings.data_format != "auto":
        return settings.data_format
    if settings.messages_column in columns:
        return "messages"
    if settings.prompt_column in columns and settings.completion_column in columns:
        return "prompt_completion"
    if settings.text_column in columns:
        return "text"
    if "conversations" in columns:  # ShareGPT's column name; its {from, value} turns are read as they are
        raise DataError(
            f"No {settings.messages_column!r} column, but a 'conversations' column (ShareGPT-style chats).",
            "set messages_column: conversations (train section), the rows are read as they are.")
    raise DataError(
        f"Cannot tell the data format from the columns {', '.join(columns)}: a causal LM trains on "
        f"a {settings.messages_column!r} column (a list of {{role, content}}), "
        f"{settings.prompt_column!r} + {settings.completion_column!r} columns, or a "
        f"{settings.text_column!r} column.",
        "rename the columns, or set messages_column / prompt_column + completion_column / "
        "text_column to the names your data uses.")


# ShareGPT rows ({"from": "human", "value": ...}) and their role names, read as {role, content}.
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "model": "assistant", "system": "system"}
TOOL_ROLES = ("tool", "function", "ipython")


def normalize_message(m: Any, j: int) -> tuple[dict | None, str | None]:
    """``({role, content}, None)`` for one message as users hand them over, or ``(None, problem)``.

    Accepted besides {role, content}: ShareGPT's {from, value} and OpenAI's list of content
    parts when every part is text (joined by newlines). Refused with the reason: tool and
    function turns, assistant tool calls, and image/audio parts (this is a text-only trainer).
    Keys a row does not have may be present as None: Arrow gives every message of a file
    the union of the keys any message has.
    """
    if not isinstance(m, dict):
        return None, f"message {j} is {type(m).__name__}, not a {{role, content}} dict"
    role, content = m.get("role"), m.get("content")
    if role is None and m.get("from") is not None:  # ShareGPT
        role = SHAREGPT_ROLES.get(str(m["from"]).strip().lower())
        if role is None:
            return None, (f"message {j} has from={m['from']!r}; ShareGPT roles read here: "
                          f"{', '.join(SHAREGPT_ROLES)}")
        content = m.get("value")
    if role in TOOL_ROLES or m.get("tool_calls") or m.get("function_call"):
        what = f"role {role!r}" if role in TOOL_ROLES else "an assistant tool call"
        return None, (f"message {j} is {what}: tool/function-calling turns are not trained here (their "
                      "calls and results would be learned as plain text or lost); drop those rows or turns")
    if isinstance(content, list):  # OpenAI-style content parts
        kinds = [part.get("type") if isinstance(part, dict) else type(part).__name__ for part in content]
        other = next((k for k in kinds if k != "text"), None)
        if other is not None or not content:
            return None, (f"message {j} has a {other!r} content part: only text parts can be trained "
                          "here (a text-only model)" if content else f"message {j} has an empty content list")
        content = "\n".join(part.get("text") or "" for part in content)
    if isinstance(role, str) and role.strip().lower() in ROLES:  # "User", "ASSISTANT " from hand-made files
        role = role.strip().lower()
    if role not in ROLES:
        return None, f"message {j} has role {role!r}; allowed: {', '.join(ROLES)} (or ShareGPT's from/value)"
    if not isinstance(content, str):
        return None, f"message {j} ({role}) has no text content (got {type(content).__name__})"
    weight = m.get("weight")
    if weight is None or role != "assistant":
        return {"role": role, "content": content}, None
    if weight not in (0, 1) or isinstance(weight, bool):
        return None, f"message {j} has weight {weight!r}; allowed: 0 (do not train on it) or 1"
    # OpenAI's fine-tuning format: weight 0 = context only, not an answer to learn
    return {"role": role, "content": content, "weight": int(weight)}, None


def normalize_messages(messages: Any) -> tuple[list[dict], str | None]:
    """Every message of a conversation normalized; the first problem if any.

    A conversation stored as JSON text (a CSV column of chats) is parsed first.
    """
    if isinstance(messages, str) and messages.lstrip().startswith("["):
        try:
            messages = json.loads(messages)
        except ValueError as exc:
            return [], f"the messages are text that starts like a JSON list but is not one ({exc})"
    if not isinstance(messages, list) or not messages:
        kind = "an empty list" if isinstance(messages, list) else type(messages).__name__
        return [], f"expected a non-empty list of {{role, content}} messages, got {kind}"
    out = []
    for j, m in enumerate(messages):
        message, problem = normalize_message(m, j)
        if problem:
            return [], problem
        out.append(message)
    return out, None


def _message_problem(messages: Any, loss_on: str) -> str | None:
    messages, problem = normalize_messages(messages)
    if problem:
        return problem
    if messages[0]["role"] == "assistant":
        return "the conversation starts with the assistant; it needs a user (or system) message first"
    empty = [j for j, m in enumerate(messages) if m["role"] == "assistant" and not m["content"].strip()]
    if empty:
        # it would train on nothing but the end-of-turn token: "answer with nothing"
        return f"assistant message {empty[0]} is empty or whitespace-only"
    if loss_on == "completion" and not any(m["role"] == "assistant" for m in messages):
        return "no assistant message: nothing to learn with loss_on='completion'"
    if loss_on == "completion" and not any(m["role"] == "assistant" and m.get("weight", 1) for m in messages):
        return "every assistant message has weight 0: nothing to learn with loss_on='completion'"
    return None


def row_problem(row: dict, fmt: str, settings: TrainConfig) -> str | None:
    if fmt == "messages":
        messages = row[settings.messages_column]
        if messages is None and row.get(settings.prompt_column) is not None:
            return (f"it is a {settings.prompt_column}/{settings.completion_column} row, the others are "
                    f"{settings.messages_column!r} rows: one format per file")
        if messages is None and row.get(settings.text_column) is not None:
            return f"it is a {settings.text_column!r} row, the others are {settings.messages_column!r} rows"
        return _message_problem(messages, settings.loss_on)
    if fmt == "text":
        text = row[settings.text_column]
        return None if isinstance(text, str) and text.strip() else f"empty or non-text value {text!r}"
    prompt, completion = row[settings.prompt_column], row[settings.completion_column]
    if isinstance(prompt, list):  # conversational prompt (a list of messages), TRL's format
        problem = _message_problem(prompt, "all")
        if problem:
            return f"prompt: {problem}"
    elif not isinstance(prompt, str):
        if prompt is None and row.get(settings.messages_column) is not None:
            return f"it is a {settings.messages_column!r} row, the others are prompt/completion rows"
        return f"prompt is {type(prompt).__name__}, not text"
    if isinstance(completion, list):
        turns, problem = normalize_messages(completion)
        if problem or not all(m["role"] == "assistant" for m in turns):
            return f"completion: expected a list of assistant messages ({problem or 'another role found'})"
        if not all(m["content"].strip() for m in turns):
            return "completion: an assistant message is empty or whitespace-only"
    elif not isinstance(completion, str) or not completion.strip():
        return f"completion is empty or not text ({completion!r})"
    return None


def duplicate_notes(splits, columns: list[str]) -> list[tuple[str, str]]:
    """Warnings for rows given twice in train, and for validation rows that are also train rows.

    Duplicates are not wrong, but they weigh those rows double, and an eval row seen in
    training makes eval_loss look better than the model is. Hashes of the columns read.
    """
    def digests(split):
        ds = splits[split].select_columns(columns)
        return [hashlib.sha1(json.dumps(row, sort_keys=True, default=str).encode()).digest() for row in ds]

    train, validation = digests("train"), digests("validation")
    first: dict[bytes, int] = {}
    twice = []
    for i, d in enumerate(train):
        if d in first:
            twice.append((first[d], i))
        else:
            first[d] = i
    notes = []
    if twice:
        locate = RowLocator(splits, "train")
        a, b = twice[0]
        notes.append((f"{len(twice)} train rows repeat an earlier train row (e.g. {locate(b)} repeats "
                      f"{locate(a)}): they weigh double in training. Drop duplicates if that is not meant.", "warn"))
    leaked = [i for i, d in enumerate(validation) if d in first]
    if leaked:
        locate = RowLocator(splits, "validation")
        notes.append((f"{len(leaked)} of {len(validation)} validation rows are also train rows (e.g. "
                      f"{locate(leaked[0])}): eval_loss will look better than the model is. Drop them from "
                      "one of the two.", "warn"))
    return notes


def to_messages(row: dict, fmt: str, settings: TrainConfig) -> list[dict]:
    """A chat row or a prompt/completion row as a list of {role, content} messages.

    ``system_prompt`` goes first in every conversation that has no system message of its
    own: a row's own system message is the more specific instruction, so it wins.
    """
    if fmt == "messages":
        messages = normalize_messages(row[settings.messages_column])[0]
    else:
        prompt, completion = row[settings.prompt_column], row[settings.completion_column]
        messages = (normalize_messages(prompt)[0] if isinstance(prompt, list)
                    else [{"role": "user", "content": prompt}])
        messages += (normalize_messages(completion)[0] if isinstance(completion, list)
                     else [{"role": "assistant", "content": completion}])
    if settings.system_prompt and not any(m["role"] == "system" for m in messages):
        messages = [{"role": "system", "content": settings.system_prompt}, *messages]
    return messages


# ------------------------------------------------------------------------- encoding
class TemplateProblem(DataError):
    """The chat template, not the row, is at fault: said once, with the row it showed on."""


def assistant_spans(tokenizer, messages: list[dict], max_length: int | None = None
                    ) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character span of each assistant turn in it.

    A turn's span runs from the end of the conversation rendered up to it with the
    generation prompt (the role header the model sees at inference) to the end of
    the conversation rendered with it (its content and the template's closing).
    With ``max_length``, turns that start past it are not looked for (they are cut anyway).
    """
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    answers = [m["content"].strip() for m in messages if m["role"] == "assistant"]
    if answers and not any(answer in text for answer in answers):
        raise TemplateProblem(
            "The chat template does not render assistant turns: none of the row's answers appear in "
            f"the text it produces (e.g. {answers[0][:40]!r} is missing), so there is nothing to train on.",
            "fix the template so it writes each assistant message's content (see chat_template='simple'), "
            "or leave chat_template unset to use the tokenizer's own.")
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant" or m.get("weight", 1) == 0:  # weight 0: context, not an answer
            continue
        before = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
        if max_length is not None and len(before) > max_length and \
                len(tokenizer(before, add_special_tokens=False)["input_ids"]) >= max_length:
            break  # this answer and the later ones start past max_length: cut anyway (long chats: O(n^2))
        upto = tokenizer.apply_chat_template(messages[:i + 1], tokenize=False)
        if not (upto.startswith(before) and text.startswith(upto)):
            raise TemplateProblem(
                "The chat template does not render each turn as a prefix of the next, so the "
                "assistant's tokens cannot be told from the prompt's.",
                "use chat_template='simple', a template of your own, or loss_on='all'.")
        spans.append((len(before), len(upto)))
    return text, spans



def encode_chat(tokenizer, messages: list[dict], *, max_length: int, loss_on: str,
                end_ids: set[int]) -> tuple[list[int], list[int]]:
    """input_ids and labels of one conversation; labels are -100 outside the assistant turns.

    The rendered text is cut at the start and end of each assistant turn and the
    pieces are tokenized separately, so the prompt's tokens are exactly those the
    model gets at inference (prompt rendered with the generation prompt): no token
    merges across the header/answer boundary. In each assistant turn the tokens up to
    and including the first end-of-turn token (``end_ids``: EOS and the generation
    config's stop tokens) are labelled; what the template puts after it (a newline)
    is not, since the model never generates past its stop token. A turn with no end
    token gets an EOS appended.
    """
    text, spans = assistant_spans(tokenizer, messages, max_length)
    cuts = sorted({0, len(text), *(c for span in spans for c in span)})
    starts = {start for start, _ in spans}
    eos = tokenizer.eos_token_id
    ids, labels = [], []
    for left, right in zip(cuts, cuts[1:], strict=False):
        piece = tokenizer(text[left:right], add_special_tokens=False)["input_ids"]
        if loss_on == "all" or left not in starts:
            ids += piece
            labels += piece if loss_on == "all" else [IGNORE] * len(piece)
            continue
        stop = next((i for i, t in enumerate(piece) if t in end_ids), None)
        if stop is None:  # the template closes this turn without an end token: add one
            ids += [*piece, eos]
            labels += [*piece, eos]
        else:
            ids += piece
            labels += piece[:stop + 1] + [IGNORE] * (len(piece) - stop - 1)
    if loss_on == "all" and ids and ids[-1] not in end_ids:
        ids.append(eos)
        labels.append(eos)
    return ids[:max_length], labels[:max_length]


def encode_text(tokenizer, text: str, *, max_length: int, end_ids: set[int]) -> tuple[list[int], list[int]]:
    """Plain language modelling: every token carries loss; EOS appended so documents end."""
    ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    if not ids or ids[-1] not in end_ids:
        ids = [*ids, tokenizer.eos_token_id]
    ids = ids[:max_length]
    return ids, list(ids)


def prompt_and_reference(row: dict) -> tuple[list[int] | None, list[int]]:
    """(tokens before the first supervised one, the supervised tokens of that first answer)."""
    labels = row["labels"]
    start = next((i for i, t in enumerate(labels) if t != IGNORE), None)
    if not start:  # no answer, or everything supervised (text rows): nothing to prompt with
        return None, []
    end = next((i for i in range(start, len(labels)) if labels[i] == IGNORE), len(labels))
    return list(row["input_ids"][:start]), list(labels[start:end])


class CausalLMDataset(Dataset):
    """Unpadded token ids and labels as Python lists; ``lengths`` feeds the length-grouped sampler."""

    def __init__(self, input_ids: list[list[int]], labels: list[list[int]]):
        self.input_ids = input_ids
        self.labels = labels
        self.lengths = [len(ids) for ids in input_ids]

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.input_ids[index], "labels": self.labels[index]}

    def supervised_tokens(self) -> int:
        """Tokens that carry loss (after the shift: the first token is never predicted)."""
        return sum(sum(1 for t in labels[1:] if t != IGNORE) for labels in self.labels)


# ------------------------------------------------------------------------- batching
@dataclass
class PaddingCollator:
    """Right-pads each batch to its own longest row: pad id, attention mask 0, label -100.

    Padding is told apart by the attention mask, never by token id: many chat
    tokenizers use their EOS as the pad token, and the EOS of an answer must train.
    """

    pad_token_id: int
    pad_to_multiple_of: int | None = None  # 8 on GPUs: tensor-core friendly shapes

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        longest = max(len(f["input_ids"]) for f in features)
        if self.pad_to_multiple_of:
            longest = math.ceil(longest / self.pad_to_multiple_of) * self.pad_to_multiple_of
        n = len(features)
        input_ids = torch.full((n, longest), self.pad_token_id, dtype=torch.long)
        labels = torch.full((n, longest), IGNORE, dtype=torch.long)
        attention_mask = torch.zeros((n, longest), dtype=torch.long)
        for i, f in enumerate(features):
            length = len(f["input_ids"])
            input_ids[i, :length] = torch.tensor(f["input_ids"])
            labels[i, :length] = torch.tensor(f["labels"])
            attention_mask[i, :length] = 1
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
