"""A saved model as one GGUF file: the inverse of what transformers' GGUF reader does on load
(transformers/modeling_gguf_pytorch_utils.py), so that reading the file back with `gguf_file=` gives the folder's
model, which is how the tests check it; the metadata keys are llama.cpp's, which reads the same file.

What the reader undoes, and so what this writes:
- tensor names: llama.cpp's (`blk.<layer>.attn_q`, ...), from the gguf package's own name map of the architecture;
- Llama's query and key rows in llama.cpp's rotary order (the two halves of each head interleaved: the reader's
  `reverse_permute`);
- Gemma 3's norm weights as 1 + weight (its RMSNorm multiplies by 1 + weight; llama.cpp stores the factor);
- tied embeddings as one tensor, `token_embd` (no `output`);
- 1-D tensors (norms, biases) in F32 whatever the type, as llama.cpp's converter keeps them; Q8_0 blocks hold 32 values
  of a row, so a matrix whose rows are no multiple of 32 is written in F16 instead, as llama.cpp falls back.

Uniform folders only: GGUF states one head count and one FFN width for every layer (llama.cpp's per-layer arrays
are read by neither transformers nor these families), so a folder whose layers differ is refused, saying why. Before
the file takes its name, its header is read back with transformers' config reader, and any shape or constant it
would read differently from the folder's config refuses the export, naming the key: a file transformers would load
as another model is never left behind.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from pipeline.core.gguf import SUFFIX
from pipeline.core.sites import GGUF_ARCHITECTURES
from pipeline.export import pre_tokenizer
from pipeline.files.schema import GGUF_TYPES, NOT_STOCK_BECAUSE, PRUNING_FILE, STOCK

# The families whose export is tested through transformers' reader (tests/test_gguf_export.py); GPT-2 and Mistral
# are read from GGUF on the way in but not yet written. The architecture names are GGUF_ARCHITECTURES', inverted.
EXPORTED_FAMILIES = ("llama", "qwen2", "qwen3", "gemma3_text")
ARCHITECTURE_OF = {hf: arch for arch, hf in GGUF_ARCHITECTURES.items() if hf in EXPORTED_FAMILIES}
# --type: the weights' ggml type and the file type llama.cpp records. An output type is offered once its round
# trip is tested: F32 and F16 to fp16 tolerance, Q8_0 to 1% of the NLL.
OUTPUT_TYPES = dict(zip(GGUF_TYPES, (("F32", "ALL_F32"), ("F16", "MOSTLY_F16"), ("Q8_0", "MOSTLY_Q8_0")), strict=True))
Q8_BLOCK = 32
# config.json keys that transformers reads back from the file (or takes as its defaults: Gemma 3's attention scale,
# window and layer pattern, which no GGUF key states): any that differs from the folder's refuses the export.
CHECKED_KEYS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps", "tie_word_embeddings",
                "max_position_embeddings", "rope_parameters", "query_pre_attn_scalar", "sliding_window",
                "layer_types", "final_logit_softcapping", "attn_logit_softcapping")


class ExportError(ValueError):
    """A folder that cannot be exported: one line naming it and why."""


def _read_config(folder: Path) -> dict:
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ExportError(f"{folder} is not a saved model folder: it has no config.json")
    try:
        config = json.loads(config_file.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ExportError(f"{config_file} is not valid JSON ({error})") from None
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type not in ARCHITECTURE_OF:
        raise ExportError(f"{folder} is a {model_type or 'model with no model_type'} model; GGUF export writes "
                          f"{', '.join(EXPORTED_FAMILIES)} models")
    return config


def _uniform_problem(folder: Path) -> str | None:
    """Why the pruned folder's layers cannot be one GGUF shape: its pruning record says it is no stock folder (the
    prune stage's non-uniform levels), with the record's own reason."""
    record_file = folder / PRUNING_FILE
    if not record_file.is_file():
        return None
    try:
        record = json.loads(record_file.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return f"its {PRUNING_FILE} is not valid JSON ({error})"
    if isinstance(record, dict) and record.get(STOCK) is False:
        return record.get(NOT_STOCK_BECAUSE) or "its layers are pruned unequally"
    return None


def _rope_theta(config) -> float:
    """The rotary base of the full-attention layers (transformers 5 keeps it in rope_parameters, per layer type where
    the layers differ, as Gemma 3's sliding layers do)."""
    rope = getattr(config, "rope_parameters", None) or {}
    if "full_attention" in rope:
        rope = rope["full_attention"]
    return float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def _llama_cpp_rows(weight, heads: int):
    """llama.cpp's row order of a Llama query or key projection (convert_hf_to_gguf.py's `permute`): the exact
    inverse of transformers' `reverse_permute` on load."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


BYTE_TOKEN = re.compile(r"<0x[0-9A-F]{2}>")  # a sentencepiece vocabulary's byte-fallback pieces
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6  # llama.cpp's token types


def _tokenizer_metadata(writer, folder: Path, config, arch: str) -> None:
    """tokenizer.ggml.* from the folder's tokenizer.json, in the two schemes whose round trip is tested:
    - byte-level BPE (GPT-2's: SmolLM2, Llama 3, Qwen) as llama.cpp's `gpt2` model, with its merges and the name of
      the split llama.cpp reproduces it with (pipeline/export/pre_tokenizer.py; refused where none does);
    - Gemma's sentencepiece BPE (byte fallback, spaces as U+2581) as llama.cpp's `llama` model: pieces in vocabulary
      order, scores falling with the order (Gemma's merge priority), byte pieces as BYTE; the merges too, so
      transformers rebuilds exactly this tokenizer.
    Special tokens are control tokens. Any other tokenizer is refused in one line."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    model = spec.get("model") or {}
    pattern = json.dumps(spec.get("pre_tokenizer"))
    byte_level = model.get("type") == "BPE" and "ByteLevel" in pattern
    sentencepiece = model.get("type") == "BPE" and model.get("byte_fallback") and arch == "gemma3"
    if not (byte_level or sentencepiece):
        raise ExportError(f"{folder}'s tokenizer ({model.get('type')}) is neither a byte-level BPE nor, for Gemma 3, "
                          f"a sentencepiece BPE with byte fallback; GGUF export writes only those")
    vocab = tokenizer.get_vocab()
    tokens = [""] * max(len(vocab), config.vocab_size)
    for token, index in vocab.items():
        if index < len(tokens):
            tokens[index] = token
    for index, token in enumerate(tokens):
        if not token:  # rows of the embedding no token uses (a vocabulary padded to a multiple)
            tokens[index] = f"[PAD{index}]"
    special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    types = [CONTROL if i in special else NORMAL for i in range(len(tokens))]
    if sentencepiece:
        types = [BYTE if BYTE_TOKEN.fullmatch(t) else kind for t, kind in zip(tokens, types, strict=True)]
        if tokenizer.unk_token_id is not None:
            types[tokenizer.unk_token_id] = UNKNOWN
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    if byte_level:
        try:
            pre = pre_tokenizer.choose(tokenizer, str(folder))
        except pre_tokenizer.PreTokenizerError as error:
            raise ExportError(str(error)) from None
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre)
    else:
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        writer.add_token_scores([-float(i) for i in range(len(tokens))])
        writer.add_add_space_prefix(False)  # Gemma's normalizer only replaces spaces; it prepends none
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    for name, token_id in (("bos", tokenizer.bos_token_id), ("eos", tokenizer.eos_token_id),
                           ("unk", tokenizer.unk_token_id), ("pad", tokenizer.pad_token_id)):
        if token_id is not None:
            getattr(writer, f"add_{name}_token_id")(token_id)
    writer.add_add_bos_token(bool(getattr(tokenizer, "add_bos_token", False)))
    if tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)


def _model_metadata(writer, config, arch: str, name: str) -> None:
    head_dim = _head_dim(config)
    writer.add_name(name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(head_dim)  # llama.cpp's head size where it is no hidden / heads (a pruned folder's)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)  # what transformers reads as Llama's head_dim
    writer.add_rope_freq_base(_rope_theta(config))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    if arch == "gemma3":
        writer.add_sliding_window(config.sliding_window)
        rope = getattr(config, "rope_parameters", None) or {}
        if "sliding_attention" in rope:
            writer.add_rope_freq_base_swa(float(rope["sliding_attention"]["rope_theta"]))


def _add_tensors(writer, model, arch: str, out_type: str) -> None:
    import gguf
    import numpy as np

    config = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], config.num_hidden_layers)
    ggml_type = gguf.GGMLQuantizationType[OUTPUT_TYPES[out_type][0]]
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # one tensor for both: transformers ties them when the file has no `output`
        base, suffix = hf_name.rsplit(".", 1)
        gguf_base = names.get_name(base)
        if gguf_base is None:
            raise ExportError(f"the model's tensor {hf_name} has no GGUF name for architecture {arch}")
        name = f"{gguf_base}.{suffix}"
        weight = tensor.detach().float().numpy()
        if arch == "llama" and base.endswith("q_proj"):
            weight = _llama_cpp_rows(weight, config.num_attention_heads)
        elif arch == "llama" and base.endswith("k_proj"):
            weight = _llama_cpp_rows(weight, config.num_key_value_heads)
        elif arch == "gemma3" and name.endswith("norm.weight"):
            weight = weight + 1.0
        weight = np.ascontiguousarray(weight, dtype=np.float32)
        kind = ggml_type if weight.ndim == 2 else gguf.GGMLQuantizationType.F32
        if kind == gguf.GGMLQuantizationType.Q8_0 and weight.shape[-1] % Q8_BLOCK:
            kind = gguf.GGMLQuantizationType.F16
        if kind == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, weight)
        elif kind == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, weight.astype(np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(weight, kind), raw_dtype=kind)


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _readback_problem(path: Path, config) -> str | None:
    """The first key of CHECKED_KEYS that transformers' GGUF config reader reads from `path` other than the folder's
    config says, or None. (Its reader takes Qwen2's head size as hidden / heads and Qwen3's as its default 128,
    whatever the file states: a pruned Qwen2 is such a case.)"""
    from transformers import AutoConfig

    read = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    for key in CHECKED_KEYS:
        want, got = getattr(config, key, None), getattr(read, key, None)
        if key == "head_dim":
            want, got = _head_dim(config), _head_dim(read)
        if isinstance(want, float) and isinstance(got, float) and abs(want - got) <= 1e-6 * abs(want):
            continue
        if want != got:
            return f"transformers' GGUF reader would read {key} {got!r} from the file, not the model's {want!r}"
    return None


def export_gguf(folder: Path, dest: Path, out_type: str = "f16") -> Path:
    """Write the model of the saved `folder` to the GGUF file `dest` in `out_type` (a key of OUTPUT_TYPES),
    atomically (a failed export leaves no file). Raises ExportError, one line, before writing anything where the
    folder cannot be exported."""
    folder, dest = Path(folder), Path(dest)
    if out_type not in OUTPUT_TYPES:
        raise ExportError(f"--type {out_type} is not written; allowed: {', '.join(OUTPUT_TYPES)}")
    if dest.suffix.lower() != SUFFIX:
        raise ExportError(f"{dest} does not end in {SUFFIX}; name the GGUF file to write")
    if not dest.parent.is_dir():
        raise ExportError(f"{dest.parent} is not a folder; create it first")
    config_dict = _read_config(folder)
    why = _uniform_problem(folder)
    if why is not None:
        raise ExportError(f"{folder} cannot be one GGUF file: {why}; GGUF gives every layer one shape, so export a "
                          f"uniform level (prune.uniform: true)")
    arch = ARCHITECTURE_OF[config_dict["model_type"]]

    import gguf
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    staging = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
    try:
        writer = gguf.GGUFWriter(staging, arch)
        writer.add_file_type(gguf.LlamaFileType[OUTPUT_TYPES[out_type][1]])
        _model_metadata(writer, model.config, arch, folder.resolve().name)
        _tokenizer_metadata(writer, folder, model.config, arch)
        _add_tensors(writer, model, arch, out_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        why = _readback_problem(staging, model.config)
        if why is not None:
            raise ExportError(f"{folder} cannot be exported to GGUF as it stands: {why}")
        os.replace(staging, dest)
    finally:
        staging.unlink(missing_ok=True)
    return dest
