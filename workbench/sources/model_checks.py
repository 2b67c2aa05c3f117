"""Checks on the model and tokenizer a run is about to train, each said in words that fix it.

The training loop calls these around loading (see each function for where):

- :func:`check_model_source` before anything is loaded: a missing local path says
  "not found" with the path (transformers says "Repo id must be in the form..."), a
  local model folder without tokenizer files is refused (transformers would quietly
  build an empty 5-token tokenizer that reads every word as ``[UNK]``).
- :func:`new_head_notice` around ``from_pretrained`` of the classifier: the fresh
  classification head every fine-tuning run starts with is announced in one calm line
  instead of transformers' red "LOAD REPORT ... MISSING classifier.weight" table; a
  real mismatch (a base-model weight missing, a conversion error) keeps that report.
- :func:`check_tokenizer` once both are loaded: the tokenizer's vocabulary against the
  model's embedding, and the share of ``[UNK]`` tokens on a sample of the training text.
- :func:`effective_max_length` once the model's config is known: a ``max_length``
  above the model's position embeddings is capped to the limit, with a warning.

Capping rather than refusing ``max_length`` is deliberate: it follows transformers'
own examples (``run_glue.py`` takes ``min(max_seq_length, model_max_length)`` with a
warning), keeps ``TrainConfig``'s default of 256 usable with 128-position models, and
a longer value cannot mean anything else: the model has no position past its limit.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from workbench.errors import ModelError
from workbench.sources.paths import looks_like_local_path, nearby

# A folder holds a tokenizer when it has one of these. Only their complete absence is
# refused up front (some tokenizers, ByT5's, need no vocabulary file at all); a folder
# with a config but a useless vocabulary is caught by check_tokenizer on real text.
_TOKENIZER_FILE = re.compile(
    r"^(tokenizer\.json|tokenizer_config\.json|special_tokens_map\.json|vocab.*|merges.*"
    r"|.*\.model|.*\.spm|.*\.tiktoken|bpe\.codes)$")

# Model types whose position ids start after the padding index, so the last
# (pad_token_id + 1) of max_position_embeddings cannot hold a token (RoBERTa: 514 -> 512).
_POSITIONS_AFTER_PADDING = {
    "roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "longformer", "data2vec-text",
    "ibert", "luke", "markuplm", "roberta-prelayernorm", "mpnet", "lilt", "ernie",
}

UNK_ERROR_SHARE = 0.5  # at least half the tokens unknown: the tokenizer is not this model's
UNK_WARN_SHARE = 0.05  # a few percent is normal (rare scripts, emoji); more is worth a look
SAMPLE_TEXTS = 256  # texts tokenized for the [UNK] share: ~50 ms with a fast tokenizer


# ------------------------------------------------------------------ before loading
def check_model_source(name_or_path: str) -> str:
    """``"folder"``, ``"gguf"`` (a GGUF file) or ``"hub"``; ModelError for a missing path or an unusable folder.

    Call at the start of ``fit``, before any loading:
    ``model_checks.check_model_source(model_choice.name_or_path)``.
    """
    text = str(name_or_path).strip()
    path = Path(text).expanduser()
    if not path.exists():
        if looks_like_local_path(text):
            raise ModelError(
                f"model folder not found: {text} ({path.absolute()} does not exist; {nearby(path)}).",
                "check the path (a folder written by save_pretrained, with config.json), or give a"
                " hub id such as 'bert-base-uncased'.")
        return "hub"
    if path.is_file() and path.suffix.lower() == ".gguf":
        from workbench.sources.gguf import check_gguf_file

        check_gguf_file(path)  # a cut-off download is said as such, before anything loads (~1 s)
        return "gguf"  # llama.cpp / Ollama weights: converted to a model folder once (workbench.sources.gguf)
    if not path.is_dir():
        raise ModelError(f"{path} is a file, not a model folder.",
                         "give the folder that holds config.json, the weights and the tokenizer files.")
    names = sorted(p.name for p in path.iterdir())
    shown = ", ".join(names[:10]) + (" ..." if len(names) > 10 else "") or "nothing"
    if "config.json" not in names:
        raise ModelError(f"{path} is not a model folder: it has no config.json (it holds: {shown}).",
                         "choose the folder written by save_pretrained (config.json + model.safetensors).")
    if not any(_TOKENIZER_FILE.match(n) for n in names):
        origin = _original_model(path)
        raise ModelError(
            f"{path} has no tokenizer files (it holds: {shown}); transformers would build an empty"
            " tokenizer that reads every word as [UNK], and the run would train on nothing.",
            "save the tokenizer the model was trained with into the folder: "
            f"AutoTokenizer.from_pretrained({origin or '<the model it was fine-tuned from>'!r})"
            f".save_pretrained({str(path)!r})"
            " (model.save_pretrained alone does not write it).")
    return "folder"


def _original_model(folder: Path) -> str | None:
    """The hub id a folder's config says it came from (``_name_or_path``), if any."""
    import json

    try:
        name = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) and name and not Path(name).is_absolute() else None


# ------------------------------------------------------------------ the new head
@dataclass
class HeadNotice:
    """What :func:`new_head_notice` saw. ``message``: the calm line, or None."""

    num_labels: int
    message: str | None = None
    report_shown: bool = False  # transformers' own report was passed through
    records: list[logging.LogRecord] = field(default_factory=list)


class _CatchReports(logging.Filter):
    def __init__(self, notice: HeadNotice):
        super().__init__()
        self.notice = notice

    def filter(self, record: logging.LogRecord) -> bool:
        if "LOAD REPORT" in str(record.msg):
            self.notice.records.append(record)
            return False  # held back; shown after the load if it is a real mismatch
        return True


_REPORT_LOGGER = "transformers.modeling_utils"  # log_state_dict_report logs here (transformers 5)
_ROW = re.compile(r"^(?P<key>\S+)\s*\|\s*(?P<status>MISSING|MISMATCH|UNEXPECTED|CONVERSION)\b")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@contextlib.contextmanager
def new_head_notice(num_labels: int, *, announce=print, quiet_progress: bool = True,
                    head: str | None = None) -> Iterator[HeadNotice]:
    """Replace transformers' load report for a new classification head by one calm line.

    transformers 5 logs a "<Class> LOAD REPORT" table (a warning, red in a notebook)
    whenever weights are missing or reshaped, which for a classifier started from a
    pretrained encoder is always the case: its head is new by design. Inside this
    block the report is held back. After the load, if every missing, reshaped or unused
    weight lies outside the base model (``model.base_model_prefix``) the head is all it
    concerns, and ``announce`` gets one line instead; otherwise (a base-model weight
    missing, a conversion error, an unknown model class) the held report is logged
    unchanged. Its red table then means something.

    Use around the classifier's ``from_pretrained`` (``ClassificationTask.build_model``)::

        with model_checks.new_head_notice(len(labels.names), announce=None) as notice:
            model = AutoModelForSequenceClassification.from_pretrained(...)
        # notice.message: log it with the run's other messages

    ``announce``: called with the line (default ``print``); None to only set ``notice.message``.
    ``quiet_progress``: hide transformers' "Loading weights" bar meanwhile (a model of a
    few hundred tensors loads in a second; the bar is noise in a cell's output and a log).
    ``head``: what the new head is, for the line (default "classification head of N labels").
    """
    from transformers.utils import logging as hf_logging

    notice = HeadNotice(num_labels)
    logger = logging.getLogger(_REPORT_LOGGER)
    catcher = _CatchReports(notice)
    bars_were_on = hf_logging.is_progress_bar_enabled()
    if quiet_progress:
        hf_logging.disable_progress_bar()
    logger.addFilter(catcher)
    try:
        yield notice
    except BaseException:
        _pass_through(logger, notice, catcher)  # a failed load: its report says why
        raise
    finally:
        logger.removeFilter(catcher)
        if quiet_progress and bars_were_on:
            hf_logging.enable_progress_bar()
    for record in notice.records:
        message = _calm_line(record.getMessage(), head or f"classification head of {num_labels} labels")
        if message is None:
            _pass_through(logger, notice)
            return
        notice.message = message
    if notice.message and announce is not None:
        announce(notice.message)


def _pass_through(logger: logging.Logger, notice: HeadNotice, catcher: logging.Filter | None = None) -> None:
    if catcher is not None:
        logger.removeFilter(catcher)
    for record in notice.records:
        logger.handle(record)
    notice.report_shown = bool(notice.records)
    notice.message = None


def _calm_line(report: str, head: str) -> str | None:
    """The line for a report that only concerns the head, or None for a real mismatch."""
    import transformers

    report = _ANSI.sub("", report)
    first = report.splitlines()[0] if report else ""
    class_name = first.split(" LOAD REPORT")[0].strip()
    model_class = getattr(transformers, class_name, None) if class_name.isidentifier() else None
    prefix = getattr(model_class, "base_model_prefix", "")
    if not prefix:
        return None  # cannot tell the base model from the head: show transformers' report
    rows = [m.groupdict() for m in map(_ROW.match, report.splitlines()) if m]
    if not rows:
        return None
    # A checkpoint's pooler (bert.pooler.*) is part of its base model, but token-classification and
    # question-answering models are built without one: unused there, like the checkpoint's own head.
    pooler = f"{prefix}.pooler."
    for row in rows:
        inside_base = row["key"].startswith(prefix + ".") or row["key"] == prefix
        unused_pooler = row["status"] == "UNEXPECTED" and row["key"].startswith(pooler)
        if row["status"] == "CONVERSION" or (inside_base and not unused_pooler):
            return None
    replaced = {r["key"] for r in rows if r["status"] == "MISMATCH"}
    unused = sorted({"pooler" if r["key"].startswith(pooler) else r["key"].split(".")[0]
                     for r in rows if r["status"] == "UNEXPECTED"})
    source = first.split(" from: ", 1)[1].strip() if " from: " in first else "the checkpoint"
    line = (f"{source}: a new {head} was created (expected when"
            " fine-tuning; training fits it)")
    if replaced:
        line += ", in place of the checkpoint's head for a different number of labels"
    if unused:
        line += f"; the checkpoint's own head ({', '.join(unused)}) is not used"
    return line + "."


# ------------------------------------------------------------------ once loaded
def sample_texts(ds, text_columns: Sequence[str], n: int = SAMPLE_TEXTS) -> list[str]:
    """Up to ``n`` texts from the first rows of ``ds`` (every text column), for check_tokenizer."""
    rows = ds.select(range(min(n, len(ds))))
    return [t for column in text_columns for t in rows[column] if isinstance(t, str) and t.strip()]


def check_tokenizer(tokenizer, model_config, texts: Iterable[str] = ()) -> list[str]:
    """Compare the tokenizer with the model; ModelError when they cannot belong together.

    Errors: more tokens than the model has embedding rows (ids past the end would crash
    or read garbage); at least half the tokens of ``texts`` unknown (``[UNK]``).
    Returned warnings (log them): a vocabulary less than half the embedding's size, or
    5-50 % unknown tokens. Call once tokenizer and model are loaded, with a sample of
    the training text: ``check_tokenizer(tokenizer, model.config, sample_texts(train, columns))``.
    """
    warnings_: list[str] = []
    size = len(tokenizer)
    vocab = getattr(model_config, "vocab_size", None)
    name = getattr(model_config, "_name_or_path", "") or "the model"
    if isinstance(vocab, int) and size > vocab:
        raise ModelError(
            f"the tokenizer has {size} tokens but {name} has embeddings for {vocab}: token ids past"
            f" {vocab - 1} have no embedding.",
            "use the tokenizer saved with this model (AutoTokenizer.from_pretrained on the same folder"
            " or hub id); if you added tokens, resize the model with model.resize_token_embeddings(len(tokenizer))"
            " and save both again.")
    if isinstance(vocab, int) and size < vocab // 2:
        warnings_.append(
            f"the tokenizer has {size} tokens for a model with {vocab} embeddings: it is probably not the"
            " tokenizer this model was trained with.")
    unk_id = getattr(tokenizer, "unk_token_id", None)
    texts = list(texts)[:SAMPLE_TEXTS]
    if unk_id is None or not texts:  # byte-level tokenizers (GPT-2...) have no unknown token
        return warnings_
    special = set(getattr(tokenizer, "all_special_ids", [])) - {unk_id}
    ids = tokenizer(texts, add_special_tokens=False, truncation=True, max_length=512)["input_ids"]
    tokens = [i for row in ids for i in row if i not in special]
    if not tokens:
        return warnings_
    unknown = sum(i == unk_id for i in tokens)
    share = unknown / len(tokens)
    example = next((t for t, row in zip(texts, ids, strict=True) if unk_id in row), "")
    words = _unknown_words(tokenizer, example, unk_id)
    said = (f"{share:.0%} of the tokens of {len(texts)} training texts are {tokenizer.unk_token}"
            f" (e.g. {', '.join(map(repr, words))}) with a tokenizer of {size} tokens")
    if share >= UNK_ERROR_SHARE:
        raise ModelError(
            f"the tokenizer does not know this text: {said}. The model would see almost no words.",
            "load the tokenizer this model was trained with (its folder must hold tokenizer.json or"
            " vocab.txt), or choose a model for this language.")
    if share >= UNK_WARN_SHARE:
        warnings_.append(f"{said}: the model will not see those words. Check that the tokenizer"
                         " and the model match the language of the data.")
    return warnings_


def _unknown_words(tokenizer, text: str, unk_id: int, limit: int = 3) -> list[str]:
    """Up to ``limit`` words of ``text`` that the tokenizer reads as unknown."""
    words = list(dict.fromkeys(text.split()))[:64]
    if not words:
        return []
    ids = tokenizer(words, add_special_tokens=False)["input_ids"]
    unknown = [w for w, row in zip(words, ids, strict=True) if unk_id in row]
    return [w[:40] for w in unknown[:limit]] or [text[:40]]


def max_positions(model_config) -> int | None:
    """How many tokens the model can take, from its config; None when it does not say."""
    limit = getattr(model_config, "max_position_embeddings", None)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
        return None
    if getattr(model_config, "model_type", None) in _POSITIONS_AFTER_PADDING:
        pad = getattr(model_config, "pad_token_id", None)
        limit -= (pad + 1) if isinstance(pad, int) else 2
    return limit


def effective_max_length(max_length: int, model_config, name: str | None = None) -> tuple[int, str | None]:
    """(max_length to use, warning or None): capped at the model's position limit.

    Call right after the model (or its config) is loaded, before tokenizing, and train
    with the returned value (also in the run record, so a resume compares like with like)::

        max_length, note = model_checks.effective_max_length(config.max_length, model.config)
    """
    limit = max_positions(model_config)
    if limit is None or max_length <= limit:
        return max_length, None
    name = name or getattr(model_config, "_name_or_path", "") or "the model"
    return limit, (f"max_length={max_length} is more than {name} can take ({limit} positions): texts are"
                   f" cut at {limit} tokens. Set max_length={limit} or less to say so and silence this.")
