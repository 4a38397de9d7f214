"""The config of the model a language-modelling experiment names, read without loading a weight, for the memory plan.

Where it comes from, first found:
- a Llama trained from scratch: its shape params (model.hidden_size, layers, heads, ...);
- `default` or a hub id, once prepare has run: the prepared folder's config.json (artifacts/<experiment>/base_model);
- a local folder: its config.json, with or without weights (a config-only folder can be planned, not run);
- a local GGUF file, and the pinned default's GGUF once fetched (.cache/assets): its header (llama.cpp's keys), and
  its tensor names for whether the output projection is tied to the embedding;
- the default before anything is fetched: `DEFAULT_CONFIG`, SmolLM2-135M-Instruct's published config.json values,
  which tests/test_memory_plan.py checks against the GGUF header whenever the pinned file is in the cache.
A hub id before prepare has no config here (no network in the checks): the plan says so in one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core.gguf import GGUFError, local_gguf, read_metadata
from pipeline.core.sites import GGUF_ARCHITECTURES
from pipeline.data.assets import LLM_MODEL
from pipeline.data.inputs import MODEL_CONFIG, WEIGHT_FILES
from pipeline.files.schema import DEFAULT, SCRATCH

if TYPE_CHECKING:
    from pipeline.tasks.language_modeling.params import LanguageModelingParams

# SmolLM2-135M-Instruct (HuggingFaceTB/SmolLM2-135M-Instruct, config.json): the keys the plan reads.
DEFAULT_CONFIG = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
                  "head_dim": 64, "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True}
# Where prepare keeps the pinned GGUF once fetched (pipeline/data/sources.py, materialize_model).
DEFAULT_GGUF = Path(".cache") / "assets" / Path(LLM_MODEL.member).name
PREPARED_MODEL = "base_model"


class PlanUnavailable(ValueError):
    """No config to plan from: one line saying why."""


def gguf_config(path: Path) -> dict:
    """A config.json's keys from a GGUF header: llama.cpp names them `<architecture>.<key>`; the vocabulary is the
    token list's length where the header states no vocab_size; the output projection is tied when the file has no
    output.weight tensor (llama.cpp's converter writes it only for untied models)."""
    architecture = read_metadata(path, ["general.architecture"]).get("general.architecture")
    keys = {"hidden_size": "embedding_length", "num_hidden_layers": "block_count",
            "num_attention_heads": "attention.head_count", "num_key_value_heads": "attention.head_count_kv",
            "head_dim": "attention.key_length", "intermediate_size": "feed_forward_length",
            "vocab_size": "vocab_size"}
    names = {f"{architecture}.{v}": k for k, v in keys.items()}
    rope = f"{architecture}.rope.dimension_count"
    found = read_metadata(path, [*names, rope, "tokenizer.ggml.tokens"])
    config = {names[k]: v for k, v in found.items() if k in names}
    if "head_dim" not in config and rope in found:  # llama.cpp's Llama files state the head size as rope's dimension
        config["head_dim"] = found[rope]
    if "vocab_size" not in config and isinstance(found.get("tokenizer.ggml.tokens"), list):
        config["vocab_size"] = len(found["tokenizer.ggml.tokens"])
    import gguf  # only here: numpy and a memory map, to list the tensor names (the metadata reader stops before)

    config["tie_word_embeddings"] = "output.weight" not in {t.name for t in gguf.GGUFReader(path).tensors}
    return config


def _folder_config(folder: Path) -> dict:
    return json.loads((folder / MODEL_CONFIG).read_text("utf-8"))


def model_config(params: LanguageModelingParams) -> tuple[dict, str]:
    """(the model's config.json keys, where they were read) for the plan, or PlanUnavailable."""
    m = params.model
    if m.name_or_path == SCRATCH:
        return ({"hidden_size": m.hidden_size, "num_hidden_layers": m.layers, "num_attention_heads": m.heads,
                 "num_key_value_heads": m.kv_heads, "intermediate_size": m.intermediate_size,
                 "vocab_size": m.vocab_size, "tie_word_embeddings": True}, "the model params (scratch)")
    path = Path(m.name_or_path).expanduser()
    try:
        gguf_file = None if m.name_or_path == DEFAULT else local_gguf(path)
        if gguf_file is not None:
            return gguf_config(gguf_file), f"{gguf_file}'s GGUF header"
        if m.name_or_path != DEFAULT and (path / MODEL_CONFIG).is_file():
            return _folder_config(path), str(path / MODEL_CONFIG)
        prepared = params.artifact_dir / PREPARED_MODEL
        if (prepared / MODEL_CONFIG).is_file():
            return _folder_config(prepared), str(prepared / MODEL_CONFIG)
        if m.name_or_path == DEFAULT:
            if DEFAULT_GGUF.is_file():
                return gguf_config(DEFAULT_GGUF), f"{DEFAULT_GGUF}'s GGUF header"
            return dict(DEFAULT_CONFIG), "SmolLM2-135M-Instruct's published config (built in; not fetched yet)"
    except (GGUFError, OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise PlanUnavailable(f"the model's config cannot be read ({error})") from None
    raise PlanUnavailable(f"{m.name_or_path} is a hub id: its config.json is read once prepare has fetched it "
                          f"({prepared})")


def plan_model_type(params: LanguageModelingParams, config: dict) -> str | None:
    """The model's family (transformers' model_type): a Llama for the default and for scratch, a config's own, a GGUF
    header's architecture by llama.cpp's name mapped to transformers'."""
    m = params.model
    if m.name_or_path in (DEFAULT, SCRATCH):
        return "llama"
    if "model_type" in config:
        return str(config["model_type"])
    gguf_file = local_gguf(Path(m.name_or_path).expanduser())
    if gguf_file is None:
        return None
    architecture = read_metadata(gguf_file, ["general.architecture"]).get("general.architecture")
    return GGUF_ARCHITECTURES.get(architecture)


def config_only_folder(params: LanguageModelingParams) -> Path | None:
    """The model folder the params name when it has a config.json but no weights: one to plan, not to run."""
    path = Path(params.model.name_or_path).expanduser()
    if params.model.name_or_path in (DEFAULT, SCRATCH) or not (path / MODEL_CONFIG).is_file():
        return None
    return None if any((path / name).is_file() for name in WEIGHT_FILES) else path
