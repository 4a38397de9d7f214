"""GGUF files (llama.cpp's format, as pretrained LLMs are often shipped) as plain Hugging Face folders.

transformers reads a GGUF file (`from_pretrained(folder, gguf_file=name)`), but the model it builds carries a
`quantization_config` and refuses `save_pretrained`, and this project must save what it prunes. So the prepare
stage converts a GGUF file once, into the folder every later stage reads: config.json (no quantization_config),
model.safetensors with the dequantised weights in float32, the tokenizer the file describes, and
generation_config.json. The folder then loads with stock `from_pretrained(folder)` and gives the logits the GGUF
load gives.

`read_metadata` reads a few header keys without loading the file, so that the input checks (no torch, about a
second) can name a file that is no GGUF, or of an architecture the head-surgery core does not support; `truncation`
reads the whole header, tensor table included, and names a file too short for the tensors it lists (a copy that
stopped early), which transformers would otherwise meet deep in a reshape.
"""

from __future__ import annotations

import struct
from collections.abc import Collection
from pathlib import Path
from typing import BinaryIO

SUFFIX = ".gguf"
MAGIC = b"GGUF"
# The value types of GGUF metadata (ggml's gguf.h) with a fixed size, as struct formats; 8 is a string (a uint64
# length, then UTF-8 bytes), 9 an array (element type, uint64 count, elements).
_FIXED = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    """A file that is not a readable GGUF file: one line naming it and what is wrong."""


def local_gguf(path: Path) -> Path | None:
    """The GGUF file a local `model.name_or_path` names: the path itself when it is a .gguf file, or the only
    .gguf file of a folder that is no Hugging Face folder (no config.json); None for anything else."""
    if path.is_file() and path.suffix.lower() == SUFFIX:
        return path
    if path.is_dir() and not (path / "config.json").is_file():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() == SUFFIX)
        return files[0] if len(files) == 1 else None
    return None


def _unpack(f: BinaryIO, fmt: str) -> tuple:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise EOFError
    return struct.unpack(fmt, data)


def _read_string(f: BinaryIO) -> str:
    (length,) = _unpack(f, "<Q")
    data = f.read(length)
    if len(data) != length:
        raise EOFError
    return data.decode("utf-8", errors="replace")


def _read_value(f: BinaryIO, kind: int, keep: bool) -> object:
    """One metadata value; with `keep` false it is skipped (an array of 49,152 token strings costs no list)."""
    if kind in _FIXED:
        fmt = "<" + _FIXED[kind]
        if not keep:
            f.seek(struct.calcsize(fmt), 1)
            return None
        return _unpack(f, fmt)[0]
    if kind == _STRING:
        return _read_string(f)
    if kind == _ARRAY:
        element, count = _unpack(f, "<IQ")
        if element in _FIXED and not keep:
            f.seek(count * struct.calcsize("<" + _FIXED[element]), 1)
            return None
        values = [_read_value(f, element, keep) for _ in range(count)]
        return values if keep else None
    raise GGUFError(f"unknown metadata value type {kind}")


def read_metadata(path: Path, keys: Collection[str]) -> dict[str, object]:
    """The values of those `keys` that the header of the GGUF file `path` holds. Reads key by key and stops once
    every key is found (general.architecture and the shape come first in llama.cpp's files), skipping what it
    does not need, so a 100 MB file answers in milliseconds. Raises GGUFError for a file that is no GGUF."""
    found: dict[str, object] = {}
    try:
        with open(path, "rb") as f:
            if f.read(4) != MAGIC:
                raise GGUFError(f"{path} is not a GGUF file (it does not start with {MAGIC.decode()})")
            (version,) = _unpack(f, "<I")
            if version < 2:  # version 1 counted in uint32; nothing that reads GGUF today writes or reads it
                raise GGUFError(f"{path} is a GGUF file of version {version}; versions 2 and later are read")
            _tensors, count = _unpack(f, "<QQ")
            for _ in range(count):
                key = _read_string(f)
                (kind,) = _unpack(f, "<I")
                value = _read_value(f, kind, keep=key in keys)
                if key in keys:
                    found[key] = value
                    if len(found) == len(keys):
                        break
    except EOFError:
        raise GGUFError(f"{path} is a truncated GGUF file (its header ends early)") from None
    except OSError as error:
        raise GGUFError(f"{path} cannot be read ({error.strerror or error})") from None
    return found


def _tensor_bytes(dims: list[int], kind: int) -> int | None:
    """The bytes of a tensor of shape `dims` in ggml type `kind`: whole blocks of `block` values, `size` bytes each
    (gguf's GGML_QUANT_SIZES); None for a type this gguf package does not know."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType  # numpy: only for a header that got this far

    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    except (ValueError, KeyError):
        return None
    count = 1
    for d in dims:
        count *= d
    return count // block * size


def truncation(path: Path) -> str | None:
    """Why the GGUF file `path` cannot hold the tensors its header lists (a truncated or cut-short copy: transformers
    would fail deep in a reshape), or None when every tensor ends within the file. Reads the whole header (every
    metadata value skipped, then each tensor's name, shape, type and offset), never the tensors."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            if f.read(4) != MAGIC:
                raise GGUFError(f"{path} is not a GGUF file (it does not start with {MAGIC.decode()})")
            _version, tensors, count = _unpack(f, "<IQQ")
            alignment = 32  # GGUF's default; general.alignment overrides it
            for _ in range(count):
                key = _read_string(f)
                (kind,) = _unpack(f, "<I")
                value = _read_value(f, kind, keep=key == "general.alignment")
                if key == "general.alignment" and isinstance(value, int) and value > 0:
                    alignment = value
            extents = []
            for _ in range(tensors):
                name = _read_string(f)
                (dims,) = _unpack(f, "<I")
                shape = list(_unpack(f, f"<{dims}Q"))
                kind, offset = _unpack(f, "<IQ")
                extents.append((name, _tensor_bytes(shape, kind), offset))
            start = -(-f.tell() // alignment) * alignment  # the tensor data begins at the next aligned byte
    except EOFError:
        return "its header ends early"
    if not extents:
        return None
    end, last = max((start + offset + (n or 0), name) for name, n, offset in extents)
    if end > size:
        return f"its tensors end at byte {end:,} ({last}), but the file has {size:,} bytes"
    return None


def convert_gguf(gguf_file: Path, dest: Path) -> Path:
    """Write the model and tokenizer of the GGUF file `gguf_file` to `dest` as a plain Hugging Face folder,
    atomically (a killed conversion leaves no folder): config.json without quantization_config, model.safetensors
    in float32 (tied embeddings stay tied), the tokenizer files and generation_config.json."""
    # Imported here: the input checks read headers with this module before anything heavy loads (pipeline.files.atomic
    # imports pandas).
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    from pipeline.files.atomic import staged_dir

    folder, name = gguf_file.parent, gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # dequantize=True unpacks every weight into an ordinary dense model and drops the quantization_config that
    # makes save_pretrained refuse; it also skips the hub lookup of a kernel for packed weights. float32 holds the
    # dequantised values as the GGUF load computes them, so the folder gives its logits.
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32,
                                                 quantization_config=GgufConfig(dequantize=True))
    # transformers leaves a GGUF tokenizer's length unbounded; the file states the context the model was trained for.
    tokenizer.model_max_length = model.config.max_position_embeddings
    with staged_dir(dest) as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
    return dest
