"""Preference pairs: the row formats and their checks, each answer's tokens and loss mask, batches.

What ``PreferenceTask`` (``preference.py``) reads rows with; no model, no loss here.

**Formats** (TRL's, found from the columns and the first row):

- ``conversational``: ``prompt`` a list of messages (or one string: the user's turn),
  ``chosen`` and ``rejected`` lists of assistant messages (or strings: one assistant turn);
- ``implicit_conversational``: no ``prompt`` column, ``chosen`` and ``rejected`` whole
  conversations; the messages they share from the start are the prompt;
- ``implicit_text``: no ``prompt`` column, ``chosen`` and ``rejected`` plain strings; the text
  they share from the start (cut back to a word boundary) is the prompt, and the text is
  tokenized as it is, without a chat template (a base model's raw-text preferences).

Conversations are rendered by the chat template exactly as the causal-LM task renders them
(``causal_lm_data.encode_chat``: the prompt's tokens are those the model sees at inference,
the answer's end-of-turn token carries loss); earlier assistant turns of a prompt are
context (weight 0), only the final answer carries loss.

**Checks.** A pair that cannot teach a preference is refused before any model loads, with
its row named (``pair_problem``): a missing or empty answer, a chosen answer equal to its
rejected one, a prompt whose answers are not assistant turns. After tokenization
(``encode_pair``): answers that tokenize identically, and a template that renders the shared
prompt differently under the two answers (its prompt would then not be a prefix of both).
Rows longer than ``max_length`` keep their prompt and lose the answers' ends: counted and
said; a row whose answers are cut away entirely, or become identical, is left out (counted).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from workbench.config import TrainConfig
from workbench.errors import DataError
from workbench.tasks.causal_lm_data import IGNORE, _message_problem, encode_chat, normalize_messages

PAIR_FORMATS = ("conversational", "implicit_conversational", "implicit_text")
SIDES = ("chosen", "rejected")


def detect_pair_format(columns: Sequence[str], first: dict, settings: TrainConfig) -> str:
    """The format of these columns (see the module's docstring); DataError naming what is missing."""
    s = settings
    missing = [c for c in (s.chosen_column, s.rejected_column) if c not in columns]
    if missing:
        raise DataError(
            f"Preference data needs a {s.chosen_column!r} and a {s.rejected_column!r} column (and optionally "
            f"{s.prompt_column!r}); this data has no {missing[0]!r} column. Its columns: {', '.join(columns)}.",
            "rename the columns, or set chosen_column / rejected_column / prompt_column to the names your data "
            "uses (train section).")
    if s.prompt_column in columns:
        return "conversational"
    return "implicit_conversational" if isinstance(first.get(s.chosen_column), list) else "implicit_text"


def _shared_messages(a: list[dict], b: list[dict]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _shared_text(a: str, b: str) -> int:
    """Characters of the prompt two strings share, cut back to before the whitespace where they part:
    the answer keeps its leading space, as BPE tokenizers attach it to the word that follows."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    while n > 0 and not a[n - 1].isspace():
        n -= 1
    return n - 1 if n > 0 else 0


def _answer(value, side: str) -> tuple[list[dict], str | None]:
    """An answer as a list of assistant messages, or the problem with it."""
    if isinstance(value, str):
        if not value.strip():
            return [], f"the {side} answer is empty or whitespace-only"
        return [{"role": "assistant", "content": value}], None
    if isinstance(value, list):
        turns, problem = normalize_messages(value)
        if problem:
            return [], f"{side}: {problem}"
        if not all(m["role"] == "assistant" for m in turns):
            role = next(m["role"] for m in turns if m["role"] != "assistant")
            return [], (f"{side}: a {role!r} message in the answer; with a prompt column the answers hold only "
                        "assistant messages (put the conversation before them in the prompt)")
        if not all(m["content"].strip() for m in turns):
            return [], f"the {side} answer has an empty or whitespace-only message"
        return turns, None
    return [], f"the {side} answer is {type(value).__name__}, not text or a list of messages"


def split_pair(row: dict, fmt: str, settings: TrainConfig) -> tuple[object, object, object, str | None]:
    """(prompt, chosen, rejected, problem): messages for the conversational formats, text for
    ``implicit_text``; ``problem`` says why the row cannot be trained on (the others are then None)."""
    s = settings
    chosen, rejected = row.get(s.chosen_column), row.get(s.rejected_column)
    for side, value in zip(SIDES, (chosen, rejected), strict=True):
        if value is None:
            return None, None, None, f"no {side} answer (the {getattr(s, side + '_column')!r} value is empty)"
    if fmt == "implicit_text":
        if not isinstance(chosen, str) or not isinstance(rejected, str):
            return None, None, None, "chosen and rejected must both be text (or both conversations)"
        if chosen == rejected:
            return None, None, None, "the chosen answer equals the rejected one: there is nothing to prefer"
        cut = _shared_text(chosen, rejected)
        prompt, answers = chosen[:cut], (chosen[cut:], rejected[cut:])
        if not prompt.strip():
            return None, None, None, ("chosen and rejected share no prompt: without a prompt column their shared "
                                      "beginning is the prompt; add a prompt column")
        empty = next((side for side, a in zip(SIDES, answers, strict=True) if not a.strip()), None)
        if empty:
            return None, None, None, f"the {empty} answer is empty after the shared prompt"
        return prompt, *answers, None
    if fmt == "implicit_conversational":
        convs = []
        for side, value in zip(SIDES, (chosen, rejected), strict=True):
            turns, problem = normalize_messages(value)
            if problem:
                return None, None, None, f"{side}: {problem}"
            convs.append(turns)
        if convs[0] == convs[1]:
            return None, None, None, "the chosen conversation equals the rejected one: there is nothing to prefer"
        n = _shared_messages(*convs)
        prompt, answers = convs[0][:n], (convs[0][n:], convs[1][n:])
        if not prompt:
            return None, None, None, ("chosen and rejected share no first message: without a prompt column the "
                                      "messages they share are the prompt; add a prompt column")
        for side, turns in zip(SIDES, answers, strict=True):
            if not turns or not all(m["role"] == "assistant" for m in turns):
                return None, None, None, (f"the {side} conversation does not end in its own assistant answer after "
                                          f"the {n} messages both share")
            if not all(m["content"].strip() for m in turns):
                return None, None, None, f"the {side} answer has an empty or whitespace-only message"
    else:
        raw = row.get(s.prompt_column)
        if isinstance(raw, str):
            if not raw.strip():
                return None, None, None, "the prompt is empty"
            prompt = [{"role": "user", "content": raw}]
        elif isinstance(raw, list):
            problem = _message_problem(raw, "all")
            if problem:
                return None, None, None, f"prompt: {problem}"
            prompt = normalize_messages(raw)[0]
        else:
            return None, None, None, f"the prompt is {type(raw).__name__}, not text or a list of messages"
        answers = []
        for side, value in zip(SIDES, (chosen, rejected), strict=True):
            turns, problem = _answer(value, side)
            if problem:
                return None, None, None, problem
            answers.append(turns)
        if [m["content"] for m in answers[0]] == [m["content"] for m in answers[1]]:
            return None, None, None, "the chosen answer equals the rejected one: there is nothing to prefer"
    if prompt[-1]["role"] == "assistant":
        return None, None, None, "the prompt ends with an assistant message: the answers must follow a user turn"
    if s.system_prompt and not any(m["role"] == "system" for m in prompt):
        prompt = [{"role": "system", "content": s.system_prompt}, *prompt]
    # Earlier assistant turns are context: only the answers carry loss.
    prompt = [{**m, "weight": 0} if m["role"] == "assistant" else m for m in prompt]
    return prompt, *answers, None


def encode_pair(tokenizer, prompt, chosen, rejected, fmt: str, end_ids: set[int]
                ) -> tuple[list[int], list[int], list[int], list[int], str | None]:
    """(chosen ids, chosen labels, rejected ids, rejected labels, problem), untruncated."""
    encoded = []
    for answer in (chosen, rejected):
        if fmt == "implicit_text":
            prompt_ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
            answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
            if not answer_ids or answer_ids[-1] not in end_ids:
                answer_ids = [*answer_ids, tokenizer.eos_token_id]
            encoded.append((prompt_ids + answer_ids, [IGNORE] * len(prompt_ids) + answer_ids))
        else:
            encoded.append(encode_chat(tokenizer, [*prompt, *answer], max_length=10**9, loss_on="completion",
                                       end_ids=end_ids))
    (c_ids, c_labels), (r_ids, r_labels) = encoded
    if c_ids == r_ids:
        return c_ids, c_labels, r_ids, r_labels, "the chosen and rejected answers tokenize identically"
    c_start, r_start = first_answer_token(c_labels), first_answer_token(r_labels)
    if c_start is None or r_start is None or c_ids[:c_start] != r_ids[:r_start]:
        return c_ids, c_labels, r_ids, r_labels, (
            "the chat template renders the shared prompt differently under the two answers, so the prompt is "
            "not a prefix of both (a template that rewrites earlier turns by what follows them)")
    return c_ids, c_labels, r_ids, r_labels, None


def first_answer_token(labels: list[int]) -> int | None:
    return next((i for i, t in enumerate(labels) if t != IGNORE), None)


def answer_tokens(labels: list[int]) -> int:
    """Tokens that carry loss, after the shift (the first token is never predicted)."""
    return sum(1 for t in labels[1:] if t != IGNORE)


class PreferenceDataset(Dataset):
    """Each pair's chosen and rejected token ids and labels, unpadded; ``lengths``: the longer of the
    two, for the length-grouped sampler."""

    def __init__(self, pairs: list[tuple[list[int], list[int], list[int], list[int]]], first_index: int = 0):
        self.pairs = pairs
        self.lengths = [max(len(c), len(r)) for c, _, r, _ in pairs]
        self.first_index = first_index  # pair_index of the first pair (the reference table's row)

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> dict:
        c_ids, c_labels, r_ids, r_labels = self.pairs[index]
        return {"chosen_input_ids": c_ids, "chosen_labels": c_labels,
                "rejected_input_ids": r_ids, "rejected_labels": r_labels, "pair_index": self.first_index + index}


@dataclass
class PairCollator:
    """Pads every chosen and rejected row of a batch to one length (right padding, labels -100,
    attention mask 0), so the two halves go through the model as one batch of 2 x rows."""

    pad_token_id: int
    pad_to_multiple_of: int | None = None

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        longest = max(max(len(f["chosen_input_ids"]), len(f["rejected_input_ids"])) for f in features)
        if self.pad_to_multiple_of:
            longest = -(-longest // self.pad_to_multiple_of) * self.pad_to_multiple_of
        batch = {}
        for side in SIDES:
            n = len(features)
            ids = torch.full((n, longest), self.pad_token_id, dtype=torch.long)
            labels = torch.full((n, longest), IGNORE, dtype=torch.long)
            mask = torch.zeros((n, longest), dtype=torch.long)
            for i, f in enumerate(features):
                length = len(f[f"{side}_input_ids"])
                ids[i, :length] = torch.tensor(f[f"{side}_input_ids"])
                labels[i, :length] = torch.tensor(f[f"{side}_labels"])
                mask[i, :length] = 1
            batch.update({f"{side}_input_ids": ids, f"{side}_attention_mask": mask, f"{side}_labels": labels})
        if "pair_index" in features[0]:
            batch["pair_index"] = torch.tensor([f["pair_index"] for f in features], dtype=torch.long)
        return batch


def both_halves(batch: dict) -> dict[str, torch.Tensor]:
    """The chosen rows then the rejected rows as one causal-LM batch (input_ids, attention_mask, labels)."""
    return {name: torch.cat([batch[f"chosen_{name}"], batch[f"rejected_{name}"]])
            for name in ("input_ids", "attention_mask", "labels")}
