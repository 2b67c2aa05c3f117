"""Fine-tune a causal language model on instructions, chats or plain text (full, LoRA or QLoRA).

What the training loop asks of a task (the same methods as ``ClassificationTask``):
check the data, load tokenizer and model, tokenize the splits, pad batches, the loss,
eval outputs and metrics, save, and the checkpoint state.

**Data.** Three row formats, found from the columns (``data_format="auto"``):
``messages`` (a list of ``{role, content}``), ``prompt`` + ``completion`` columns,
or one ``text`` column (plain language modelling). Chats and pairs are rendered
by the tokenizer's own chat template; a tokenizer without one is refused unless
``chat_template`` names the simple built-in template or gives a Jinja template.

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

**Batches.** Rows are tokenized once, unpadded; batches are padded to their own
longest row (right padding, labels -100, attention mask 0). On CUDA with a
FlashAttention implementation, batches are instead flattened into one row with
the sequence boundaries kept (``DataCollatorWithFlattening``): no padding at
all, and no row attends to another.

**Loss.** The LM head over a 49k-152k vocabulary costs as much as several
transformer layers, and in chat data most positions are prompt tokens whose logits
would be thrown away. So the model is asked for logits only at the positions that
carry loss (``logits_to_keep`` with a boolean mask: transformers gathers those
hidden states before the head), through the model's own forward so that DDP,
FSDP and peft hooks all run. The result equals ``model(**batch).loss``.

Why one module of ~900 lines: one task, everything a causal LM needs from data to
saved adapter (formats and their checks, chat template, loss mask, collator, LoRA wiring,
evaluation); the next split is the data encoding and its checks apart from the task object.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from workbench.config import ModelChoice, TrainConfig
from workbench.errors import ConfigError, DataError
from workbench.sources.data import ROW_COLUMN, RowLocator
from workbench.tasks import lora
from workbench.tasks.base import (
    enable_gradient_checkpointing,
    fingerprint,
    load_full_state,
    load_pretrained,
)

MERGED_DIR = "model_merged"  # beside model/ (the adapter) when merge_adapter is set
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


def _row_problem(row: dict, fmt: str, settings: TrainConfig) -> str | None:
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


def _duplicate_notes(splits, columns: list[str]) -> list[tuple[str, str]]:
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


def uses_flash_attention(model) -> bool:
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None) or ""
    return "flash" in impl


# --------------------------------------------------------------------------- losses
def _loss_positions(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask of positions whose next token carries loss, those next tokens in row-major order)."""
    next_labels = labels[:, 1:]
    supervised = next_labels != IGNORE
    keep = torch.zeros_like(labels, dtype=torch.bool)
    keep[:, :-1] = supervised
    return keep, next_labels[supervised]


def _model_inputs(batch: dict) -> dict:
    # Everything the collators produce except labels: the loss is computed here, not by the model.
    return {k: v for k, v in batch.items() if k != "labels"}


def supervised_logits(model, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits at the positions that carry loss [N, V], their targets [N], the keep mask [B, T])."""
    keep, targets = _loss_positions(batch["labels"])
    out = model(**_model_inputs(batch), logits_to_keep=keep, use_cache=False)
    logits = out.logits
    if logits.dim() != 2:  # an architecture that ignores a tensor logits_to_keep: gather here
        logits = logits[keep] if logits.shape[1] == keep.shape[1] else logits.reshape(-1, logits.shape[-1])
    return logits, targets, keep


def token_loss(model, batch: dict) -> torch.Tensor:
    """Mean cross-entropy over the batch's supervised tokens, logits only where they carry loss."""
    logits, targets, _ = supervised_logits(model, batch)
    # fp32 softmax: under bf16 autocast the log-sum-exp over 49k+ classes loses digits.
    return F.cross_entropy(logits.float(), targets, reduction="mean")


# ------------------------------------------------------------------------- the task
class CausalLMTask:
    """Causal-LM fine-tuning (full, LoRA, QLoRA) with any AutoModelForCausalLM."""

    name = "causal_lm"

    def __init__(self, settings: TrainConfig | None = None, **overrides):
        """``settings``: the run's TrainConfig (its causal_lm fields); ``overrides``: fields to change."""
        self.settings = dataclasses.replace(settings or TrainConfig(task="causal_lm"), task="causal_lm",
                                            **overrides)
        self.format: str | None = None
        self.model_name: str | None = None
        self.template_source: str | None = None  # tokenizer | simple | custom
        self.end_ids: set[int] = set()
        self.padding_free = False
        self.dropped: dict[str, int] = {}  # rows whose supervised tokens were all truncated away
        self.parameters: dict[str, int] = {}
        self.vocab_size: int | None = None  # the LM head's outputs: ln of it is a uniform guess's loss
        self.targets: list[str] = []
        self.notes: list[tuple[str, str]] = []  # (text, level) from set-up, logged after "start"
        self.data_fingerprint: str | None = None
        self.eval_dataset: CausalLMDataset | None = None  # for the generation check

    # ---------------------------------------------------------------- data
    def check_data(self, splits) -> None:
        """Everything that can be wrong with the rows, found before any model is loaded.

        A QLoRA run on a machine that cannot do it is refused here too: before any folder is
        made or any model downloaded."""
        if self.settings.finetune == "qlora":
            lora.require_qlora_support()
        if not hasattr(splits, "keys"):
            raise DataError(f"data must be a DatasetDict with 'train' and 'validation' splits, "
                            f"not {type(splits).__name__}.",
                            "pass a DatasetDict, a DatasetChoice, or a path to local files.")
        for split in ("train", "validation"):
            ds = splits.get(split)
            if ds is None:
                raise DataError(f"The dataset has no '{split}' split.",
                                "pass a DatasetDict with 'train' and 'validation' splits.")
            if len(ds) == 0:
                raise DataError(f"The {split} split is empty (0 rows).",
                                "check the file or split name, or the max_*_rows caps.")
            fmt = detect_format([c for c in ds.column_names if c != ROW_COLUMN], self.settings)
            if self.format is not None and fmt != self.format:
                raise DataError(f"The train split holds {self.format} rows but {split} holds {fmt} rows.",
                                "give both splits the same columns.")
            self.format = fmt
            needed = {"messages": [self.settings.messages_column], "text": [self.settings.text_column],
                      "prompt_completion": [self.settings.prompt_column, self.settings.completion_column]}[fmt]
            missing = [c for c in needed if c not in ds.column_names]
            if missing:
                raise DataError(f"The {split} split has no column {missing[0]!r} for data_format={fmt!r}; "
                                f"available: {', '.join(ds.column_names)}.",
                                "set the *_column settings to your column names.")
            self._check_rows(splits, split, needed)
        self._check_generation()
        self.notes += self._system_prompt_notes(splits["train"])
        self.data_fingerprint = fingerprint(splits["train"], needed)  # resume checks it is the same data
        self.notes += _duplicate_notes(splits, needed)

    def _check_rows(self, splits, split: str, needed: list[str]) -> None:
        """Every row of ``split`` can be trained on; else a DataError naming the rows in the user's file."""
        ds = splits[split]
        locate = RowLocator(splits, split)
        # The other formats' columns, when the file has them: a row of another format says so.
        others = [c for c in (self.settings.messages_column, self.settings.prompt_column,
                              self.settings.completion_column, self.settings.text_column)
                  if c in ds.column_names and c not in needed]
        problems = []  # (position in the file, row, problem)
        for i, row in enumerate(ds.select_columns(needed + others)):
            problem = _row_problem(row, self.format, self.settings)
            if problem:
                problems.append((locate.position(i), i, problem))
        count = len(problems)
        bad = [f"{locate(i)}: {problem}" for _, i, problem in sorted(problems)[:CHECK_ROWS_SHOWN]]
        if bad:
            more = f" (and {count - len(bad)} more)" if count > len(bad) else ""
            raise DataError(f"{count} of {len(ds)} {split} rows cannot be trained on: " + "; ".join(bad)
                            + f"{more}.", "fix or drop those rows in the file (datasets: ds.filter(...)) "
                            "before training.")

    def _system_prompt_notes(self, ds) -> list[tuple[str, str]]:
        """Where system_prompt goes in chat rows: first, in each conversation without a system message."""
        s = self.settings
        if not s.system_prompt:
            return []
        if self.format == "text":
            raise ConfigError("system_prompt", s.system_prompt, "None for plain-text (text column) data",
                              fix="remove system_prompt: text rows are trained as they are, with no chat "
                                  "template to put a system message in; use messages or prompt/completion "
                                  "rows to train with one.")

        def has_system(value) -> bool:
            return isinstance(value, list) and any(m["role"] == "system" for m in normalize_messages(value)[0])

        own = sum(map(has_system, ds[s.messages_column if self.format == "messages" else s.prompt_column]))
        text = (f"system_prompt is put first in {len(ds) - own} of {len(ds)} train conversations"
                + (f"; {own} have a system message of their own, which is kept instead." if own else "."))
        return [(text, "info")]

    def _check_generation(self) -> None:
        """eval_generate needs a prompt to answer and a reference answer: chat or pair rows."""
        s = self.settings
        if not s.eval_generate:
            return
        if self.format == "text":
            raise ConfigError("eval_generate", s.eval_generate, "0 for plain-text (text column) data",
                              fix="set eval_generate: 0: text rows have no prompt to answer and no reference "
                                  "answer, so exact match cannot be measured (it would be nan); eval_loss "
                                  "and eval_perplexity are reported as usual.")
        if s.loss_on == "all":
            raise ConfigError("eval_generate", s.eval_generate, "0 with loss_on='all'",
                              fix="set eval_generate: 0, or loss_on: completion (exact match compares the "
                                  "answer to the supervised tokens, which are every token with loss_on='all').")

    def check_model(self, choice: ModelChoice) -> None:
        """Settings that depend on the model's layers, checked on an empty (meta-device) copy of it
        built from its config: no weights are read, so a wrong ``lora_target_modules`` is refused in
        well under a second, before anything is written or loaded. Skipped when the config cannot
        be read here (a hub id not cached, a .gguf not converted yet): the real load checks again."""
        if self.settings.finetune == "full" or not self.settings.lora_target_modules:
            return
        try:
            from transformers import AutoConfig, AutoModelForCausalLM

            config = AutoConfig.from_pretrained(str(choice.name_or_path), revision=choice.revision,
                                                local_files_only=True)
            with torch.device("meta"):
                skeleton = AutoModelForCausalLM.from_config(config)
        except Exception:  # noqa: BLE001 - any failure here is reported by the real load
            return
        lora.check_targets(skeleton, list(self.settings.lora_target_modules))

    def load_tokenizer(self, choice: ModelChoice):
        from transformers import AutoTokenizer

        tokenizer = load_pretrained(AutoTokenizer, choice)
        if tokenizer.pad_token is None:  # padding is masked by the attention mask and labels anyway
            tokenizer.pad_token = tokenizer.eos_token
        chosen = self.settings.chat_template
        if chosen == "simple":
            tokenizer.chat_template, self.template_source = SIMPLE_TEMPLATE, "simple"
        elif chosen:
            tokenizer.chat_template, self.template_source = chosen, "custom"
        elif tokenizer.chat_template:
            self.template_source = "tokenizer"
        elif self.format in ("messages", "prompt_completion"):
            raise DataError(
                f"The tokenizer of {choice.name_or_path!r} has no chat template, so {self.format} rows "
                "cannot be rendered the way the model will be prompted.",
                "pick an instruct/chat model, or set chat_template='simple' (### User / ### Assistant "
                "headers) or your own Jinja template, or train on a text column (data_format='text').")
        return tokenizer

    def datasets(self, splits, tokenizer, max_length: int, model=None):
        self.end_ids = {tokenizer.eos_token_id}
        generation = getattr(model, "generation_config", None)
        stop = getattr(generation, "eos_token_id", None)
        self.end_ids |= set(stop if isinstance(stop, (list, tuple)) else [stop] if stop is not None else [])
        self.end_ids.discard(None)
        if self.format is None:
            self.check_data(splits)
        train, self.eval_dataset = (self._encode_split(splits, s, tokenizer, max_length)
                                    for s in ("train", "validation"))
        return train, self.eval_dataset

    def _encode_split(self, splits, split: str, tokenizer, max_length: int) -> CausalLMDataset:
        settings, fmt, ds = self.settings, self.format, splits[split]
        locate = RowLocator(splits, split)
        all_ids, all_labels, dropped, cut = [], [], [], 0
        for i, row in enumerate(ds):
            try:
                if fmt == "text":
                    ids, labels = encode_text(tokenizer, row[settings.text_column], max_length=max_length,
                                              end_ids=self.end_ids)
                else:
                    ids, labels = encode_chat(tokenizer, to_messages(row, fmt, settings), max_length=max_length,
                                              loss_on=settings.loss_on, end_ids=self.end_ids)
            except TemplateProblem as exc:
                raise TemplateProblem(f"{exc.message} (first seen on {locate(i)})", exc.fix) from None
            except Exception as exc:  # jinja2's TemplateError, raise_exception() in the template...
                if "jinja" not in type(exc).__module__ and "TemplateError" not in type(exc).__name__:
                    raise
                raise DataError(f"The chat template fails on {locate(i)}: {exc}",
                                "fix that row (many templates require user/assistant turns to alternate and "
                                "allow one system message, first), or use another chat_template.") from None
            if all(t == IGNORE for t in labels[1:]):
                dropped.append(i)  # the answer lies beyond max_length: a row with no loss teaches nothing
                continue
            # Cut inside an answer: the end-of-turn token is gone, the model never learns to stop there.
            cut += fmt != "text" and len(ids) == max_length and labels[-1] not in (IGNORE, *self.end_ids)
            all_ids.append(ids)
            all_labels.append(labels)
        self.dropped[split] = len(dropped)
        if not all_ids:
            raise DataError(f"Every row of the {split} split loses its answer to truncation at "
                            f"max_length={max_length} tokens (e.g. {locate(dropped[0])}).",
                            "raise max_length, or shorten the prompts.")
        if dropped:
            where = ", ".join(locate(i) for i in sorted(dropped, key=locate.position)[:CHECK_ROWS_SHOWN])
            self.notes.append((f"{len(dropped)} of {len(ds)} {split} rows were left out: their answer starts "
                               f"after max_length={max_length} tokens ({where}{', ...' if len(dropped) > 3 else ''}"
                               "). Raise max_length to keep them.", "warn"))
        if cut and cut * 2 >= len(all_ids):
            share = "every" if cut == len(all_ids) else f"{cut} of {len(all_ids)}"
            self.notes.append((f"{share} {split} answer is cut at max_length={max_length} tokens before its "
                               "end-of-turn token: the model learns to start answers but not to stop them. "
                               f"Raise max_length (longest row here: {max(map(len, all_ids))}+ tokens).", "warn"))
        return CausalLMDataset(all_ids, all_labels)

    def collator(self, tokenizer):
        if self.padding_free:
            from transformers import DataCollatorWithFlattening

            # One row per batch, positions restarting at each example, FlashAttention's
            # cu_seq_lens marking the boundaries: no pad tokens, no cross-example attention.
            return DataCollatorWithFlattening(return_flash_attn_kwargs=True)
        return PaddingCollator(tokenizer.pad_token_id, pad_to_multiple_of=8 if torch.cuda.is_available() else None)

    # ---------------------------------------------------------------- model
    def build_model(self, choice: ModelChoice, tokenizer, config=None):
        """The model ready to train: adapters on a frozen base (lora/qlora), or all weights (full)."""
        from transformers import AutoModelForCausalLM

        settings = self.settings
        checkpointing = bool(getattr(config, "gradient_checkpointing", False))
        kwargs: dict[str, Any] = {"dtype": torch.float32}
        if settings.finetune == "qlora":
            lora.require_qlora_support()
            compute = _half_dtype()
            kwargs = {"dtype": compute, "quantization_config": lora.quantization_config(compute),
                      "device_map": {"": torch.cuda.current_device()}}
        elif settings.finetune == "lora" and torch.cuda.is_available() and \
                getattr(config, "precision", "auto") != "fp32":
            # The base is frozen: no master weights or AdamW state needed, so 16-bit halves its memory.
            kwargs["dtype"] = _half_dtype()
        model = load_pretrained(AutoModelForCausalLM, choice, **kwargs)
        self.model_name = choice.name_or_path
        head = model.get_output_embeddings()
        self.vocab_size = int(head.weight.shape[0]) if head is not None else getattr(model.config, "vocab_size", None)
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        if checkpointing:
            model.config.use_cache = False  # the KV cache is useless in training and conflicts with recomputation
            if settings.finetune != "qlora":  # prepare_model_for_kbit_training does it for QLoRA
                enable_gradient_checkpointing(model)
        if settings.finetune == "full":
            self.targets = []
        else:
            model = lora.wrap(model, r=settings.lora_r, alpha=settings.lora_alpha,
                              dropout=settings.lora_dropout,
                              targets=list(settings.lora_target_modules or []) or None,
                              quantized=settings.finetune == "qlora", gradient_checkpointing=checkpointing)
            self.targets = sorted(model.peft_config["default"].target_modules)
            if checkpointing:
                # Frozen embeddings give the first checkpointed segment no input that needs grad;
                # reentrant checkpointing would then drop the adapters' gradients.
                model.enable_input_require_grads()
        self.padding_free = torch.cuda.is_available() and uses_flash_attention(model)
        self.parameters = {"total": sum(p.numel() for p in model.parameters()),
                           "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad)}
        return model

    # ---------------------------------------------------------------- steps
    def rows(self, batch: dict) -> int:
        if "position_ids" in batch and "attention_mask" not in batch:  # flattened: one row per example
            return int((batch["position_ids"] == 0).sum())
        return int(batch["input_ids"].shape[0])

    def split(self, batch: dict, size: int) -> list[dict]:
        """Micro-batches of at most ``size`` examples (after an out-of-memory).

        A padded batch is cut by rows. A flattened one (one row, examples end to end) is cut
        at example boundaries, with the FlashAttention sequence offsets recomputed per piece.
        """
        if "attention_mask" in batch or "position_ids" not in batch:
            return [{k: v[i:i + size] for k, v in batch.items()} for i in range(0, self.rows(batch), size)]
        positions = batch["position_ids"][0]
        starts = [*(positions == 0).nonzero()[:, 0].tolist(), positions.numel()]
        pieces = []
        for first in range(0, len(starts) - 1, size):
            bounds = starts[first:first + size + 1]
            left, right = bounds[0], bounds[-1]
            piece = {k: batch[k][:, left:right] for k in ("input_ids", "labels", "position_ids")}
            if "cu_seq_lens_q" in batch:
                offsets = torch.tensor([b - left for b in bounds], dtype=torch.int32,
                                       device=batch["cu_seq_lens_q"].device)
                longest = max(b - a for a, b in zip(bounds, bounds[1:], strict=False))
                piece.update(cu_seq_lens_q=offsets, cu_seq_lens_k=offsets,
                             max_length_q=longest, max_length_k=longest)
            pieces.append(piece)
        return pieces

    def units(self, batch: dict) -> torch.Tensor:
        """Supervised tokens: what the loss averages over, so accumulation weights by them.

        A tensor on the batch's device, not an int: .item() here would cost a host sync per micro-batch.
        """
        return (batch["labels"][:, 1:] != IGNORE).sum()

    def loss(self, model, batch: dict) -> torch.Tensor:
        return token_loss(model, batch)

    def eval_outputs(self, model, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-row (summed loss, supervised token count), for a token-weighted mean across processes."""
        logits, targets, keep = supervised_logits(model, batch)
        losses = F.cross_entropy(logits.float(), targets, reduction="none")
        row_of = keep.nonzero()[:, 0]  # row-major order, as logits_to_keep gathered them
        rows = keep.shape[0]
        summed = torch.zeros(rows, device=losses.device).index_add_(0, row_of, losses)
        counts = torch.zeros(rows, device=losses.device).index_add_(0, row_of, torch.ones_like(losses))
        return summed, counts

    def metrics(self, outputs: list[tuple[torch.Tensor, ...]]) -> dict[str, float]:
        summed, counts = (torch.cat(parts).double() for parts in zip(*outputs, strict=True))
        loss = (summed.sum() / counts.sum().clamp(min=1)).item()
        return {"eval_loss": loss, "eval_perplexity": math.exp(min(loss, 50.0))}  # exp(50): overflow guard

    def generation_metrics(self, model, tokenizer) -> dict[str, float]:
        """``eval_exact_match`` on ``eval_generate`` eval rows; {} when that is 0 (the default)."""
        if not self.settings.eval_generate or self.eval_dataset is None:
            return {}
        return self.generation_check(model, tokenizer, self.eval_dataset)

    def generation_check(self, model, tokenizer, dataset: CausalLMDataset, limit: int | None = None,
                         max_new_tokens: int | None = None) -> dict[str, float]:
        """``eval_exact_match``: greedy answers to the first ``limit`` eval prompts vs the references.

        The prompt is each row up to its first supervised token (the role header
        included, as at inference); the reference is the supervised text without
        special tokens. Both are compared after stripping whitespace. One row at a
        time: no left padding to get right, and ``limit`` keeps it cheap.
        """
        limit = self.settings.eval_generate if limit is None else limit
        max_new_tokens = max_new_tokens or self.settings.eval_max_new_tokens
        model = _unwrap(model)
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        hits = rows = 0
        with torch.inference_mode():
            for index in range(min(limit, len(dataset))):
                prompt, reference = prompt_and_reference(dataset[index])
                if prompt is None:
                    continue
                ids = torch.tensor([prompt], device=device)
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id)
                answer = tokenizer.decode(out[0, len(prompt):], skip_special_tokens=True)
                hits += answer.strip() == tokenizer.decode(reference, skip_special_tokens=True).strip()
                rows += 1
        model.train(was_training)
        return {"eval_exact_match": hits / rows if rows else float("nan")}

    # ---------------------------------------------------------------- saving
    def save_model(self, model, tokenizer, directory: str | os.PathLike,
                   state_dict: dict | None = None) -> Path:
        """LoRA: the adapter folder (PeftModel.from_pretrained loads it); full: a whole model folder.

        ``state_dict`` (Accelerate's gathered one under FSDP) may hold the whole peft
        model: PeftModel.save_pretrained keeps only the adapter's entries of it.
        """
        directory = Path(directory)
        _unwrap(model).save_pretrained(directory, state_dict=state_dict)
        tokenizer.save_pretrained(directory)
        return directory

    def finish(self, model_dir: Path, write_dir) -> list[tuple[str, str]]:
        """With ``merge_adapter``: ``model_merged/`` beside ``model_dir``, the base with the adapter merged in."""
        if not self.settings.merge_adapter:
            return []
        if self.settings.finetune == "full":
            return [(f"merge_adapter: finetune='full' trains every weight, so {model_dir} is already a "
                     "plain model; nothing to merge.", "info")]
        merged = model_dir.parent / MERGED_DIR
        # 16-bit on a GPU (as the base trained), fp32 on the CPU
        dtype = _half_dtype() if torch.cuda.is_available() else torch.float32
        write_dir(merged, lambda tmp: lora.merge_adapter_folder(model_dir, tmp, dtype=dtype))
        return [(f"Merged model (base + adapter) saved in {merged}: "
                 f"pipeline('text-generation', model={str(merged)!r}) loads it.", "info")]

    def merge_and_save(self, model, tokenizer, directory: str | os.PathLike) -> Path:
        """A plain model folder with the adapter merged in; ``pipeline("text-generation", model=...)`` loads it."""
        model = _unwrap(model)
        if not lora.is_peft(model):
            return self.save_model(model, tokenizer, directory)
        return lora.merge_and_save(model, tokenizer, directory)

    def model_state(self, model) -> dict[str, torch.Tensor]:
        """The trainable weights only: the adapter for LoRA (a few MB), every weight for full."""
        model = _unwrap(model)
        if lora.is_peft(model):
            return lora.adapter_state(model)
        return model.state_dict()

    def load_model_state(self, model, state: dict[str, torch.Tensor]) -> None:
        model = _unwrap(model)
        if lora.is_peft(model):
            lora.load_adapter_state(model, state)
            return
        load_full_state(model, state, "resume with the model and finetune setting the run was started with.")

    def num_classes(self) -> int | None:
        """The vocabulary the LM head predicts over (its output size, padding rows included)."""
        return self.vocab_size

    def identity(self) -> dict:
        """Facts that make a run this run, for the run record (and a resume check)."""
        s = self.settings
        facts = {"task": self.name, "model": self.model_name, "finetune": s.finetune,
                 "data_fingerprint": self.data_fingerprint,
                 "data_format": self.format, "loss_on": s.loss_on, "chat_template": self.template_source,
                 "parameters": dict(self.parameters), "padding_free": self.padding_free,
                 "dropped_rows": dict(self.dropped)}
        if s.finetune != "full":
            facts["lora"] = {"r": s.lora_r, "alpha": s.lora_alpha, "dropout": s.lora_dropout,
                             "target_modules": list(self.targets)}
        return facts


# -------------------------------------------------------------------------- helpers
def _half_dtype() -> torch.dtype:
    return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float16


def _unwrap(model):
    # DDP/FSDP/torch.compile wrappers keep the real model in .module / ._orig_mod
    while hasattr(model, "module") or hasattr(model, "_orig_mod"):
        model = getattr(model, "module", None) or model._orig_mod
    return model
