"""A Hugging Face model folder -> one GGUF file (f16 or q8_0), in pure Python with the ``gguf`` package.

What llama.cpp's ``convert_hf_to_gguf.py`` does for the Llama and Qwen2 families, without a
checkout or a C++ build: the ``gguf`` package's writer, its tensor-name map, its vocabulary
helper (``SpecialVocab``: merges, special token ids, chat template) and its q8_0 quantizer
(bit-exact with llama.cpp's). The choices follow that script so llama.cpp, Ollama and LM Studio
read the file as they read its own:

- **Tensors.** Names from ``gguf.get_tensor_name_map``; Llama's q/k projections permuted into
  llama.cpp's rotary layout (Qwen2's are not); 1-D tensors and norms in f32, every other weight
  in f16 or q8_0 (f16 when a row is not a multiple of q8_0's 32-value blocks); a tied output
  head is not written (llama.cpp reuses the embedding). Llama 3's rope scaling adds llama.cpp's
  ``rope_freqs`` tensor. Tensors are read one at a time from the safetensors files and streamed
  to disk: memory stays near one tensor, not the model.
- **Tokenizer.** Byte-level BPE vocabularies (Llama 3, Qwen2/2.5, SmolLM2...) as ``gpt2`` with
  the pre-tokenizer name llama.cpp knows them by: it hashes the token ids of a fixed text
  (``CHECK_TEXT``) and looks the hash up (``PRE_TOKENIZERS``, from llama.cpp's
  ``get_vocab_base_pre``). An unknown hash is an error, not a guess: a wrong pre-tokenizer
  splits text differently from the model's training. SentencePiece vocabularies (Llama 2, the
  first Mistral releases) are refused with that reason.
- **What makes an export chat.** The chat template the run trained with, BOS/EOS/padding ids,
  whether the tokenizer adds a BOS (measured, not read from a flag), and the end-of-turn token
  (``tokenizer.ggml.eot_token_id``), so a runtime stops where the model learnt to stop.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path

import numpy as np

from workbench.errors import ExportError

TYPES = ("f16", "q8_0")
# Hugging Face architecture -> (GGUF architecture, q/k rows permuted for llama.cpp's rotary layout)
ARCHITECTURES = {
    "LlamaForCausalLM": ("llama", True),
    "MistralForCausalLM": ("llama", True),  # llama.cpp runs Mistral as llama
    "Qwen2ForCausalLM": ("qwen2", False),
}
SUPPORTED = "the Llama family (Llama 2/3, SmolLM, TinyLlama, Mistral: LlamaForCausalLM, " \
            "MistralForCausalLM) and Qwen2/Qwen2.5 (Qwen2ForCausalLM)"

# llama.cpp's convert_hf_to_gguf.py get_vocab_base_pre: the token ids of this text, hashed,
# name the pre-tokenizer (how text is split before BPE) in tokenizer.ggml.pre.
CHECK_TEXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ "
    "🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ "
    "------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? "
    "'M not sure I'll make it, 'D you like some tea? We'Ve a'lL"
)
PRE_TOKENIZERS = {
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",  # Meta-Llama-3-8B
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",  # Qwen1.5 / Qwen2 / Qwen2.5
    "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c": "qwen2",  # Qwen3 embedding vocab
    "b3f499bb4255f8ca19fccd664443283318f2fd2414d5e0b040fbdd0cc195d6c5": "deepseek-r1-qwen",
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",  # SmolLM / SmolLM2
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454": "gpt-2",
    "63b97e4253352e6f357cc59ea5b583e3a680eaeaf2632188c2b952de2588485e": "tekken",  # Mistral Nemo
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclass
class GGUFFacts:
    """What was written: enough for the report, the card and the Modelfile."""

    path: Path
    type: str
    architecture: str
    tensors: int
    tensor_types: dict[str, int]
    tokenizer_model: str
    tokenizer_pre: str
    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    add_bos: bool
    chat_template: str | None
    context_length: int | None
    size_bytes: int = 0
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- checks
def read_config(model_dir: Path) -> dict:
    try:
        return json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ExportError(f"{model_dir} has no readable config.json ({exc}): it is not a model folder.",
                          "export a run folder or a saved model folder (save_pretrained).") from None


def architecture_of(config: dict, model_dir: Path) -> tuple[str, bool]:
    names = config.get("architectures") or [config.get("model_type", "unknown")]
    for name in names:
        if name in ARCHITECTURES:
            return ARCHITECTURES[name]
    raise ExportError(f"{model_dir} is a {', '.join(map(str, names))} model; the GGUF export supports "
                      f"{SUPPORTED}.", "export a model of one of those families, or use llama.cpp's "
                      "convert_hf_to_gguf.py, which knows more architectures.")


def check_tokenizer_files(model_dir: Path) -> dict:
    """tokenizer.json (parsed) when the folder has what the vocabulary is read from; else ExportError."""
    missing = [name for name in TOKENIZER_FILES if not (model_dir / name).is_file()]
    if missing:
        raise ExportError(f"{model_dir} has no {' and no '.join(missing)}: the tokenizer travels inside the GGUF "
                          "file and is read from there.",
                          "save the tokenizer beside the model (tokenizer.save_pretrained(folder)); a run's "
                          "model/ and model_merged/ folders have it.")
    try:
        return json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ExportError(f"{model_dir / 'tokenizer.json'} cannot be read ({exc}).",
                          "save the tokenizer again (tokenizer.save_pretrained(folder)).") from None


def pre_tokenizer_name(tokenizer) -> str:
    digest = sha256(str(tokenizer.encode(CHECK_TEXT)).encode()).hexdigest()
    name = PRE_TOKENIZERS.get(digest)
    if name is None:
        raise ExportError(f"The tokenizer's pre-tokenizer is not one llama.cpp is known to implement "
                          f"(check hash {digest[:16]}...): a GGUF with a guessed one would split text "
                          "differently from the model's training.",
                          "export a model with a Llama 3, Qwen2 or SmolLM tokenizer, or convert with "
                          "llama.cpp's convert_hf_to_gguf.py (after its update script learns the hash).")
    return name


# ----------------------------------------------------------------------------- vocabulary
def bpe_vocab(tokenizer, vocab_size: int) -> tuple[list[str], list[int]]:
    """Tokens and token types as llama.cpp's get_vocab_base writes them (ids past the tokenizer's
    vocabulary, padding rows of the embedding, become [PAD<id>], unused)."""
    import gguf

    reverse = {i: t for t, i in tokenizer.get_vocab().items()}
    added = tokenizer.get_added_vocab()
    decoder = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        token = reverse[i]
        if token in added:
            if not decoder[i].normalized:
                token = tokenizer.decode(tokenizer.encode(token, add_special_tokens=False))
            special = decoder[i].special or (token.startswith("<|") and token.endswith("|>"))
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
        tokens.append(token)
    return tokens, types


def adds_special(tokenizer, token_id: int | None, first: bool) -> bool:
    """Whether the tokenizer itself puts ``token_id`` first (BOS) or last (EOS) on plain text."""
    if token_id is None:
        return False
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return bool(ids) and ids[0 if first else -1] == token_id


# ----------------------------------------------------------------------------- tensors
def _tensor_sources(model_dir: Path) -> dict[str, Path]:
    """tensor name -> the safetensors file that holds it."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        return {name: model_dir / file for name, file in weight_map.items()}
    single = model_dir / "model.safetensors"
    if not single.is_file():
        raise ExportError(f"{model_dir} has no model.safetensors: the weights are not in a form the export reads.",
                          "save the model with save_pretrained (safetensors, the default), or export the run "
                          "folder, whose merged model is saved so.")
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as f:
        return {name: single for name in f.keys()}  # noqa: SIM118 - safe_open has no __iter__


def permute(weights, n_head: int, n_head_kv: int | None):
    """llama.cpp's LlamaModel.permute: HF's rotary halves interleaved the way ggml's rope reads them."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def _qtype(gguf_name: str, shape: tuple[int, ...], wanted: str):
    import gguf

    Q = gguf.GGMLQuantizationType
    if len(shape) <= 1 or gguf_name.endswith("_norm.weight"):
        return Q.F32  # what llama.cpp's kernels expect for norms and biases
    if wanted == "q8_0" and shape[-1] % gguf.GGML_QUANT_SIZES[Q.Q8_0][0] == 0:
        return Q.Q8_0
    return Q.F16


def _llama3_rope_freqs(config: dict) -> np.ndarray | None:
    """llama.cpp's rope_freqs tensor for Llama 3.1+ rope scaling (rope_type "llama3")."""
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if str(rope.get("rope_type", rope.get("type", ""))).lower() != "llama3":
        return None
    base = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low, high = rope.get("factor", 8.0), rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old = rope.get("original_max_position_embeddings", 8192)
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            factors.append(1.0)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(factors, dtype=np.float32)


@dataclass
class _Planned:
    gguf_name: str
    hf_name: str | None  # None: generated (rope_freqs)
    source: Path | None
    shape: tuple[int, ...]
    qtype: object
    permute_heads: tuple[int, int | None] | None = None
    data: np.ndarray | None = None  # generated tensors


def _plan(model_dir: Path, config: dict, gguf_arch: str, permute_qk: bool, wanted: str) -> list[_Planned]:
    import gguf
    from safetensors import safe_open

    arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == gguf_arch)
    n_blocks = config["num_hidden_layers"]
    names = gguf.get_tensor_name_map(arch, n_blocks)
    n_head, n_kv = config["num_attention_heads"], config.get("num_key_value_heads")
    tied = bool(config.get("tie_word_embeddings"))
    planned = []
    rope = _llama3_rope_freqs(config) if gguf_arch == "llama" else None
    if rope is not None:
        planned.append(_Planned(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", None, None,
                                rope.shape, gguf.GGMLQuantizationType.F32, data=rope))
    by_file: dict[Path, list[str]] = {}
    for hf_name, source in _tensor_sources(model_dir).items():
        by_file.setdefault(source, []).append(hf_name)
    for source, hf_names in by_file.items():
        with safe_open(str(source), framework="pt") as f:
            for hf_name in hf_names:
                if hf_name.endswith(".rotary_emb.inv_freq") or (tied and hf_name == "lm_head.weight"):
                    continue
                gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
                if gguf_name is None:
                    raise ExportError(f"The tensor {hf_name!r} of {model_dir} has no GGUF name for {gguf_arch}: "
                                      "the model has layers this export does not know.",
                                      "export a standard model of the family, or use llama.cpp's converter.")
                shape = tuple(f.get_slice(hf_name).get_shape())
                heads = None
                if permute_qk and hf_name.endswith(("q_proj.weight", "q_proj.bias")):
                    heads = (n_head, n_head)
                elif permute_qk and hf_name.endswith(("k_proj.weight", "k_proj.bias")):
                    heads = (n_head, n_kv)
                planned.append(_Planned(gguf_name, hf_name, source, shape, _qtype(gguf_name, shape, wanted), heads))
    return planned


def _nbytes(item: _Planned) -> tuple[tuple[int, ...], object, int]:
    """(shape as the writer wants it, numpy dtype, bytes) of a planned tensor."""
    import gguf

    Q = gguf.GGMLQuantizationType
    count = math.prod(item.shape)
    if item.qtype == Q.F32:
        return item.shape, np.float32, count * 4
    if item.qtype == Q.F16:
        return item.shape, np.float16, count * 2
    byte_shape = gguf.quant_shape_to_byte_shape(item.shape, item.qtype)
    return byte_shape, np.uint8, math.prod(byte_shape)


def _arrays(planned: list[_Planned]) -> Iterator[np.ndarray]:
    """Each planned tensor's data, converted, one at a time (files opened once each)."""
    import gguf
    import torch
    from safetensors import safe_open

    handles: dict[Path, object] = {}
    try:
        for item in planned:
            if item.data is not None:
                yield item.data
                continue
            if item.source not in handles:
                handles[item.source] = safe_open(str(item.source), framework="pt").__enter__()
            tensor = handles[item.source].get_tensor(item.hf_name)
            if tensor.dtype not in (torch.float16, torch.float32):
                tensor = tensor.to(torch.float32)  # bf16: numpy has none; f32 first, as llama.cpp does
            if item.permute_heads is not None:
                tensor = permute(tensor, *item.permute_heads)
            yield gguf.quants.quantize(tensor.float().numpy(), item.qtype)
    finally:
        for handle in handles.values():
            handle.__exit__(None, None, None)


# ----------------------------------------------------------------------------- the file
def write_gguf(model_dir: str | os.PathLike, path: str | os.PathLike, type: str = "f16", *, name: str,
               tokenizer=None, eot_id: int | None = None, description: str | None = None,
               base_model: str | None = None) -> GGUFFacts:
    """Write the model in ``model_dir`` as ``path`` (``type``: f16 | q8_0).

    ``tokenizer``: the folder's tokenizer, loaded (the caller needs it for the chat template
    too); ``eot_id``: the end-of-turn token the chat template closes answers with; ``base_model``:
    what it was fine-tuned from (``general.base_model.0.name``).
    """
    import gguf
    from transformers import AutoTokenizer

    if type not in TYPES:
        raise ExportError(f"GGUF type {type!r} is not one of {', '.join(TYPES)}.",
                          "use f16 (no quality loss, half the fp32 size) or q8_0 (about half of f16, "
                          "near-lossless).")
    model_dir, path = Path(model_dir), Path(path)
    config = read_config(model_dir)
    gguf_arch, permute_qk = architecture_of(config, model_dir)
    tokenizer_json = check_tokenizer_files(model_dir)
    model = tokenizer_json.get("model") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        raise ExportError(f"The tokenizer of {model_dir} is a {'SentencePiece-style ' if model.get('byte_fallback') else ''}"
                          f"{model.get('type')} vocabulary; this export writes byte-level BPE vocabularies "
                          "(Llama 3, Qwen2/2.5, SmolLM2), whose text splitting it can check.",
                          "convert this model with llama.cpp's convert_hf_to_gguf.py (it reads tokenizer.model).")
    tokenizer = tokenizer or AutoTokenizer.from_pretrained(model_dir)
    vocab_size = int(config.get("vocab_size") or len(tokenizer.get_vocab()))
    if max(tokenizer.get_vocab().values()) >= vocab_size:
        raise ExportError(f"The tokenizer of {model_dir} has ids beyond the model's vocab_size {vocab_size}.",
                          "resize the embeddings to the tokenizer (model.resize_token_embeddings) and save again.")
    pre = pre_tokenizer_name(tokenizer)
    tokens, token_types = bpe_vocab(tokenizer, vocab_size)
    planned = _plan(model_dir, config, gguf_arch, permute_qk, type)
    file_type = gguf.LlamaFileType.MOSTLY_Q8_0 if type == "q8_0" else gguf.LlamaFileType.MOSTLY_F16

    writer = gguf.GGUFWriter(path=None, arch=gguf_arch)
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name)
    if description:
        writer.add_description(description)
    if base_model:
        writer.add_base_model_count(1)
        writer.add_base_model_name(0, str(base_model))
    _add_hparams(writer, config, gguf_arch)
    writer.add_file_type(file_type)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    special = gguf.SpecialVocab(model_dir, load_merges=True, n_vocab=len(tokens))
    special.chat_template = tokenizer.chat_template or special.chat_template  # the one the run trained with
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    special.add_special_token["bos"] = add_bos = adds_special(tokenizer, bos, first=True)
    special.add_special_token["eos"] = adds_special(tokenizer, eos, first=False)
    special.add_to_gguf(writer, quiet=True)
    pre_tokenizer = tokenizer_json.get("pre_tokenizer") or {}
    if "add_prefix_space" in pre_tokenizer:
        writer.add_add_space_prefix(bool(pre_tokenizer["add_prefix_space"]))
    if eot_id is not None:
        writer.add_eot_token_id(int(eot_id))
    for item in planned:
        shape, dtype, nbytes = _nbytes(item)
        writer.add_tensor_info(item.gguf_name, shape, np.dtype(dtype), nbytes, raw_dtype=item.qtype)

    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        writer.write_header_to_file(path=tmp)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for array in _arrays(planned):
            writer.write_tensor_data(array)
        writer.close()
        os.replace(tmp, path)
    finally:
        writer.close()
        tmp.unlink(missing_ok=True)
    counts: dict[str, int] = {}
    for item in planned:
        counts[item.qtype.name] = counts.get(item.qtype.name, 0) + 1
    return GGUFFacts(path=path, type=type, architecture=gguf_arch, tensors=len(planned), tensor_types=counts,
                     tokenizer_model="gpt2", tokenizer_pre=pre, vocab_size=len(tokens), bos_id=bos, eos_id=eos,
                     eot_id=eot_id, add_bos=add_bos, chat_template=special.chat_template,
                     context_length=config.get("max_position_embeddings"), size_bytes=path.stat().st_size)


def _add_hparams(writer, config: dict, gguf_arch: str) -> None:
    """The model's shape, as llama.cpp's TextModel / LlamaModel set_gguf_parameters write it."""
    import gguf

    writer.add_block_count(config["num_hidden_layers"])
    if config.get("max_position_embeddings"):
        writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config.get("num_key_value_heads") or config["num_attention_heads"])
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    theta = rope.get("rope_theta", config.get("rope_theta"))
    if theta is not None:
        writer.add_rope_freq_base(float(theta))
    rope_type = str(rope.get("rope_type", rope.get("type", "")) or "").lower()
    if rope_type == "linear" and rope.get("factor"):
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    elif rope_type == "yarn" and rope.get("factor"):
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    writer.add_layer_norm_rms_eps(config.get("rms_norm_eps", 1e-6))
    if config.get("head_dim"):
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    if gguf_arch == "llama":
        writer.add_vocab_size(config["vocab_size"])
        writer.add_rope_dimension_count(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
