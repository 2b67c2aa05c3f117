"""Offline chat data (and preference pairs on it) for tests, the `ci` regression profile and benchmarks.

A reading task with short answers, shaped like real instruction data: a prompt of
a few dozen tokens (some notes, one of which holds the fact asked about, then the
question) and an answer of a few tokens. A model learns the answer's form in a
few steps and where to copy it from in a few more, so eval loss falls measurably
under LoRA; a broken loss mask or label shift shows up as a loss that does not.
"""

from __future__ import annotations

import random

COLORS = ["red", "blue", "green", "yellow", "purple", "orange", "white", "black", "grey", "pink"]
THINGS = ["door", "roof", "fence", "gate", "mailbox", "bicycle", "car", "boat", "kite", "umbrella"]
OWNERS = ["Anna", "Bruno", "Chen", "Dara", "Emil", "Fatima", "Goran", "Hana", "Ivo", "Julia", "Kofi",
          "Lena", "Marek", "Nora", "Omar", "Petra"]
FILLER = [
    "The weather was mild all week.", "A new bakery opened on the corner.",
    "The library extended its opening hours.", "Traffic was light on Sunday morning.",
    "The town council met on Tuesday.", "A storm is expected next month.",
    "The school choir gave a concert.", "Several streets were repaved in spring.",
    "The market sells fresh fish on Fridays.", "A small park was planted near the river.",
]


def make_chat_rows(n: int, seed: int = 0, fmt: str = "messages") -> list[dict]:
    """``n`` rows as ``{"messages": [...]}`` (fmt="messages") or ``{"prompt", "completion"}``."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        owner, thing, color = rng.choice(OWNERS), rng.choice(THINGS), rng.choice(COLORS)
        decoy_owner = rng.choice([o for o in OWNERS if o != owner])
        notes = rng.sample(FILLER, rng.randint(1, 5))
        notes.insert(rng.randint(0, len(notes)), f"{owner}'s {thing} is {color}.")
        notes.insert(rng.randint(0, len(notes)),
                     f"{decoy_owner}'s {rng.choice(THINGS)} is {rng.choice(COLORS)}.")
        prompt = "Notes: " + " ".join(notes) + f"\nQuestion: What color is {owner}'s {thing}?"
        answer = f"It is {color}."
        if fmt == "messages":
            rows.append({"messages": [{"role": "user", "content": prompt},
                                      {"role": "assistant", "content": answer}]})
        else:
            rows.append({"prompt": prompt, "completion": answer})
    return rows


def make_chat_dataset(n_train: int = 200, n_eval: int = 40, fmt: str = "messages", seed: int = 0):
    """A DatasetDict with train and validation splits of :func:`make_chat_rows`."""
    from datasets import Dataset, DatasetDict

    return DatasetDict({
        "train": Dataset.from_list(make_chat_rows(n_train, seed, fmt)),
        "validation": Dataset.from_list(make_chat_rows(n_eval, seed + 1, fmt)),
    })


EVASIVE = ["I am not sure.", "I cannot tell you that.", "Nobody knows.", "Maybe ask someone else.",
           "That is hard to say.", "I do not know."]


def make_preference_rows(n: int, seed: int = 0, fmt: str = "conversational") -> list[dict]:
    """``n`` preference pairs on :func:`make_chat_rows`' questions: the chosen answer gives the
    color from the notes, the rejected one evades (half the time) or names another color.

    ``fmt``: ``conversational`` (TRL's prompt/chosen/rejected message lists), ``standard``
    (the same as strings) or ``implicit`` (whole conversations, no prompt column).
    """
    rng = random.Random(seed + 7919)  # not the chat rows' own stream: their questions stay the same
    rows = []
    for chat in make_chat_rows(n, seed):
        prompt, answer = chat["messages"][0]["content"], chat["messages"][1]["content"]
        color = answer.removeprefix("It is ").rstrip(".")
        wrong = rng.choice([c for c in COLORS if c != color])
        rejected = rng.choice(EVASIVE) if rng.random() < 0.5 else f"It is {wrong}."
        user = [{"role": "user", "content": prompt}]
        if fmt == "standard":
            rows.append({"prompt": prompt, "chosen": answer, "rejected": rejected})
        elif fmt == "implicit":
            rows.append({"chosen": [*user, {"role": "assistant", "content": answer}],
                         "rejected": [*user, {"role": "assistant", "content": rejected}]})
        else:
            rows.append({"prompt": user, "chosen": [{"role": "assistant", "content": answer}],
                         "rejected": [{"role": "assistant", "content": rejected}]})
    return rows


def make_preference_dataset(n_train: int = 200, n_eval: int = 40, fmt: str = "conversational", seed: int = 0):
    """A DatasetDict with train and validation splits of :func:`make_preference_rows`."""
    from datasets import Dataset, DatasetDict

    return DatasetDict({
        "train": Dataset.from_list(make_preference_rows(n_train, seed, fmt)),
        "validation": Dataset.from_list(make_preference_rows(n_eval, seed + 1, fmt)),
    })


MULTIPLE_CHOICE_TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def write_color_task(folder, n: int, name: str = "colors_mc", seed: int = 0):
    """A local lm-evaluation-harness task in ``folder`` (``<name>.yaml`` + ``<name>.jsonl``): ``n`` questions
    "whose kite is which color", each with the 10 colors as choices. Offline, for tests and benchmarks of
    ``workbench.evaluate``; returns the task's name (pass ``include_path=folder``)."""
    import json
    from pathlib import Path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    with (folder / f"{name}.jsonl").open("w", encoding="utf-8") as f:
        for _ in range(n):
            owner, color = rng.choice(OWNERS), rng.choice(COLORS)
            question = f"{owner}'s kite is {color}. {rng.choice(FILLER)} What color is {owner}'s kite?"
            f.write(json.dumps({"question": question, "choices": COLORS, "answer": COLORS.index(color)}) + "\n")
    (folder / f"{name}.yaml").write_text(MULTIPLE_CHOICE_TASK.format(name=name, data=folder / f"{name}.jsonl"),
                                         encoding="utf-8")
    return name
