"""Offline stand-ins for the hub: a generated sentiment task and a tiny BERT.

Tests, the `ci` regression profile and CPU demos cannot download weights or data,
so they use what this module builds locally: sentences whose sentiment is
learnable (a broken training loop cannot reach high accuracy on them), a WordPiece
tokenizer trained on those sentences with `tokenizers`, and a small randomly
initialised BERT saved with ``save_pretrained`` so that every code path that
loads a real model folder is exercised.
"""

from __future__ import annotations

import csv
import math
import random
from pathlib import Path

POSITIVE = [
    "great", "wonderful", "excellent", "delightful", "brilliant", "charming", "moving",
    "superb", "enjoyable", "fantastic", "beautiful", "clever", "touching", "gripping",
]
NEGATIVE = [
    "awful", "terrible", "boring", "dreadful", "tedious", "clumsy", "dull", "painful",
    "horrible", "lifeless", "bland", "messy", "annoying", "forgettable",
]
NEUTRAL = [
    "the film", "this movie", "the plot", "the cast", "the director", "the script",
    "the ending", "the soundtrack", "the story", "the camera work", "the second act",
    "the lead actor", "the dialogue", "the pacing", "the set design", "the editing",
]
FILLER = [
    "and", "but", "then", "while", "although", "as", "because", "so", "also", "really",
    "quite", "very", "somewhat", "at times", "overall", "in the end", "for me", "honestly",
    "i think", "to be fair", "after a while", "in places", "on the whole", "frankly",
]
LABELS = ("negative", "positive")


def make_sentence(rng: random.Random, label: str) -> str:
    """One review-like sentence; its length follows a log-normal like real text."""
    words = POSITIVE if label == "positive" else NEGATIVE
    n_clauses = max(1, min(12, int(math.exp(rng.gauss(0.7, 0.6)))))
    clauses = []
    for _ in range(n_clauses):
        subject = rng.choice(NEUTRAL)
        adjective = rng.choice(words)
        filler = rng.choice(FILLER)
        clauses.append(f"{subject} is {filler} {adjective}")
    return (", ".join(clauses) + ".").capitalize()


def make_rows(n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` rows of ``{"text": ..., "label": "positive"|"negative"}``, balanced."""
    rng = random.Random(seed)
    return [{"text": make_sentence(rng, LABELS[i % 2]), "label": LABELS[i % 2]} for i in range(n)]


def write_csv(path: str | Path, n: int, seed: int = 0) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=["text", "label"])
        writer.writeheader()
        writer.writerows(make_rows(n, seed))
    return path


def make_dataset(n_train: int = 800, n_eval: int = 200, seed: int = 0):
    """A ``datasets.DatasetDict`` with ``train`` and ``validation`` splits."""
    from datasets import Dataset, DatasetDict

    return DatasetDict(
        train=Dataset.from_list(make_rows(n_train, seed)),
        validation=Dataset.from_list(make_rows(n_eval, seed + 1)),
    )


def train_tokenizer(texts: list[str] | None = None, vocab_size: int = 400):
    """A WordPiece BERT tokenizer trained on ``texts`` (default: generated sentences)."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    texts = texts or [row["text"] for row in make_rows(2000, seed=123)]
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False))
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    tok.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
        model_max_length=128,
    )


def make_tiny_bert(
    path: str | Path,
    *,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 2,
    seed: int = 0,
    texts: list[str] | None = None,
    vocab_size: int = 400,
) -> Path:
    """Save a small random BERT for sequence classification and its tokenizer to ``path``.

    The folder looks exactly like a downloaded model (config.json, weights,
    tokenizer files), so loading code is the same as for ``bert-base-uncased``.
    ``texts``: what the WordPiece tokenizer is trained on (default: generated reviews).
    """
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    path = Path(path)
    if (path / "config.json").is_file():
        return path  # already built: the same seed gives the same model
    tokenizer = train_tokenizer(texts, vocab_size=vocab_size)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        intermediate_size=hidden_size * 4,
        max_position_embeddings=128,
        num_labels=2,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config)
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(path)  # a half-written folder is never mistaken for a model
    return path
