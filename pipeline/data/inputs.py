"""The user's inputs that every task family checks alike, before anything heavy loads: the model that
`model.name_or_path` names (a local folder, a GGUF file or a hub id), the hub when a name needs it, the levels of
pruning its shape can take, and what the families' data checks share (reading a source file, splits carved out of
train, hub corpora).

Each family's `inputs` module (`pipeline/tasks/<family>/inputs.py`) declares what it accepts (`ACCEPTS`, an
`Accepts`), reads and checks its own data, and gives the checks its `problems(params)`; the prepare stage and
`python -m pipeline.checks` run them first (pipeline/run/preflight.py), in about a second (no torch, no
transformers, no pandas). Problems are one line each, naming the param, the file and what would be right.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from pipeline.core.gguf import SUFFIX, GGUFError, local_gguf, read_metadata, truncation
from pipeline.core.levels import AttentionShape, LevelError, heads_to_save
from pipeline.core.sites import FAMILIES, GGUF_ARCHITECTURES
from pipeline.data.catalog import HubCorpus
from pipeline.data.local_files import InputError, Table, check_fractions, looks_like_path, missing_path, read_table
from pipeline.files.schema import DEFAULT, SCRATCH, SPLITS, WHOLE

if TYPE_CHECKING:
    from pipeline.config.params import PruneParams

MODEL_CONFIG = "config.json"
# What AutoTokenizer reads: a fast tokenizer's file, a slow one's vocabulary, or a sentencepiece model.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json")
TOKENIZER_PATTERNS = ("*.model", "*.spm")
WEIGHT_FILES = (
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
# pandas' default missing-value markers: a label spelled so is a hole in the data, not a class.
HUB = "https://huggingface.co"
# The positions transformers' GGUF reader gives every GPT-2 (GPT2Config's default: the reader puts the file's
# context_length in n_ctx, which the model ignores), and so the only GPT-2 GGUF that converts.
GPT2_GGUF_POSITIONS = 1024


# --- the hub ----------------------------------------------------------------------------------------------------------


def hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the Hugging Face hub cannot be reached from here (HF_HUB_OFFLINE, or the endpoint's host refusing a TCP
    connection within `timeout` seconds), or None when it can."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", HUB))
    host, port = endpoint.hostname or "", endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as error:
        return f"{host}:{port}: {error.strerror or error}"
    return None


def offline_advice(what: str) -> str:
    return f"{what}; point it at local files instead (the README's 'When something is wrong'), or use default"


@dataclass(frozen=True)
class Accepts:
    """What a task family takes, as data in its inputs module (`ACCEPTS`): the checks refuse anything else in one
    line before prepare writes a file, rather than a later stage failing on it."""

    task: str  # the params' `task`, which the refusals name
    # config.json's model_type (a GGUF file's general.architecture) of the models whose head the family's stages
    # load, train and evaluate end to end: a subset of the head-surgery core's FAMILIES.
    model_families: Collection[str]
    # Examples of every class in each split that a stratified split carves out of train (classification: every
    # split is scored on every class); 0 where the family's data has no classes.
    min_per_class_and_split: int = 0
    # The runtime.placement values its stages run: "sharded" and "layerwise" only where the family loads through
    # accelerate's device_map and scores one decoder layer at a time (language modelling); a placement a family
    # would silently ignore is refused instead.
    placements: Collection[str] = (WHOLE,)


def placement_problems(placement: str, accepts: Accepts | None) -> list[str]:
    """`runtime.placement` if the family does not run it, in one line naming those it does (a family that declares
    no `Accepts` runs the default ones)."""
    allowed = Accepts.placements if accepts is None else accepts.placements
    if placement in allowed:
        return []
    task = "this" if accepts is None else f"the {accepts.task}"
    return [f"runtime.placement: {placement} is not run by {task} task; allowed: {', '.join(allowed)}"]


def _not_taken(model_type: str | None, what: str, key: str, accepts: Accepts) -> list[str]:
    """A model of a family the core supports but the task does not take (a GPT-2 for classification), in one line;
    an unsupported family has its own line."""
    if model_type not in FAMILIES or model_type in accepts.model_families:
        return []
    return [f"{key}: {what}, which the {accepts.task} task does not take; allowed: "
            f"{', '.join(sorted(accepts.model_families))}"]


# --- the model --------------------------------------------------------------------------------------------------------


def quantization_problem(config: dict, where: str, key: str) -> str | None:
    """Why a checkpoint whose config has a quantization_config cannot be used, in one line; None when it has none.
    Heads are pruned and the result saved with save_pretrained, which transformers refuses for a quantized model
    (GGUF's "not serializable"), and the quantized layers are no nn.Linear that head surgery could cut."""
    quantization = config.get("quantization_config")
    if quantization is None:
        return None
    method = quantization.get("quant_method", "not named") if isinstance(quantization, dict) else "not named"
    return (f"{key}: {where} is a quantized checkpoint ({MODEL_CONFIG} has quantization_config, quant_method "
            f"{method}), which can be neither pruned nor saved; a GGUF file or folder is converted by prepare: name "
            f"the .gguf file instead; a bitsandbytes, GPTQ, AWQ or other quantized checkpoint: use the unquantised "
            f"model")


def _safetensors_problem(path: Path) -> str | None:
    """Why `path` is no readable safetensors file, or None: its 8-byte header length, its JSON header, and the
    tensors' extents (`data_offsets`, after the header) against the file's size. The header alone, so a truncated or
    overwritten weights file is named here, as the user's input, not in a later stage's traceback."""
    try:
        file_size = path.stat().st_size
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = f.read(size) if size <= file_size - 8 else b""
        if len(header) != size or not header:
            return "its header is cut short"
        tensors = json.loads(header)
        ends = [t["data_offsets"][1] for name, t in tensors.items() if name != "__metadata__"]
    except OSError as error:
        return str(error.strerror or error)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return "its header is not JSON"
    except (AttributeError, TypeError, KeyError, IndexError):
        return "its header lists no tensor extents (data_offsets)"
    end = 8 + size + max(ends, default=0)
    if end > file_size:
        return f"it is truncated: its tensors end at byte {end:,}, but the file has {file_size:,} bytes"
    return None


def weight_problems(folder: Path, key: str) -> list[str]:
    """The weight files of `folder` that cannot be what their headers say, each named as the user's file: the single
    model.safetensors, or each shard a sharded index names (missing or damaged). Before prepare copies anything."""
    index = folder / WEIGHT_FILES[1]
    if not index.is_file():
        single = folder / WEIGHT_FILES[0]
        why = _safetensors_problem(single) if single.is_file() else None
        return [] if why is None else [f"{key}: {single} is not a readable safetensors file ({why}); copy or save "
                                       f"the model again"]
    try:
        shards = sorted(set(json.loads(index.read_text("utf-8"))["weight_map"].values()))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as error:
        return [f"{key}: {index} is not a readable shard index ({type(error).__name__}: {error}); copy or save the "
                f"model again"]
    problems = []
    for shard in shards:
        path = folder / str(shard)
        if not path.is_file():
            problems.append(f"{key}: {path} is missing: {index.name} names it as one of the model's {len(shards)} "
                            f"shards; copy the whole folder again")
        elif (why := _safetensors_problem(path)) is not None:
            problems.append(f"{key}: {path} is not a readable safetensors file ({why}); copy or save the model "
                            f"again")
    return problems


def model_folder_problems(folder: Path, key: str, accepts: Accepts) -> list[str]:
    """What keeps `folder` from being a model this pipeline can prune for `accepts.task`: its config, its family,
    its weights."""
    config_file = folder / MODEL_CONFIG
    if not config_file.is_file():
        found = sorted(p.name for p in folder.iterdir())[:8]
        return [f"{key}: {folder} is not a model folder: it has no {MODEL_CONFIG} (found: "
                f"{', '.join(found) or 'nothing'}); expected a Hugging Face model folder (save_pretrained's) or a "
                f"folder holding one {SUFFIX} file"]
    try:
        config = json.loads(config_file.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return [f"{key}: {config_file} is not valid JSON ({error})"]
    if not isinstance(config, dict):
        return [f"{key}: {config_file} is not a JSON object"]
    model_type = config.get("model_type")
    problems = [line for line in [quantization_problem(config, str(folder), key)] if line]
    if model_type not in FAMILIES:
        problems.append(f"{key}: {folder} is a {model_type or 'model with no model_type'} model, which the "
                        f"head-surgery core does not support; supported families (config.json model_type): "
                        f"{', '.join(sorted(FAMILIES))}")
    problems += _not_taken(model_type, f"{folder} is a {model_type} model", key, accepts)
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        problems.append(f"{key}: {folder} has a {MODEL_CONFIG} but no weights (expected one of "
                        f"{', '.join(WEIGHT_FILES)})")
    else:
        problems += weight_problems(folder, key)
    if not (any((folder / name).is_file() for name in TOKENIZER_FILES)
            or any(next(folder.glob(pattern), None) for pattern in TOKENIZER_PATTERNS)):
        problems.append(f"{key}: {folder} has no tokenizer (expected {', '.join(TOKENIZER_FILES)} or a "
                        f"sentencepiece model): save it beside the model with tokenizer.save_pretrained")
    return problems


def gguf_problems(path: Path, key: str, accepts: Accepts) -> list[str]:
    """What keeps the GGUF file `path` from becoming a model this pipeline can prune, from its header alone: prepare
    converts it (pipeline/core/gguf.py), so it needs an architecture the head-surgery core supports and the task
    takes, and a tokenizer."""
    try:
        header = read_metadata(path, ["general.architecture", "tokenizer.ggml.model"])
    except GGUFError as error:
        return [f"{key}: {error}"]
    architecture = header.get("general.architecture")
    model_type = GGUF_ARCHITECTURES.get(architecture)
    problems = []
    if model_type is None:
        problems.append(f"{key}: {path} is a GGUF file of architecture {architecture or 'not named'}, which the "
                        f"head-surgery core does not read from GGUF; supported architectures (llama.cpp's names): "
                        f"{', '.join(sorted(GGUF_ARCHITECTURES))}")
    problems += _not_taken(model_type, f"{path} is a GGUF file of architecture {architecture}", key, accepts)
    if architecture == "gpt2":
        context = read_metadata(path, ["gpt2.context_length"]).get("gpt2.context_length")
        if context is not None and context != GPT2_GGUF_POSITIONS:
            problems.append(f"{key}: {path} is a GPT-2 of {context} positions, but transformers' GGUF reader builds "
                            f"every GPT-2 with {GPT2_GGUF_POSITIONS:,} (it ignores context_length), so prepare could "
                            f"not convert it; convert the original checkpoint instead")
    if "tokenizer.ggml.model" not in header:
        problems.append(f"{key}: {path} holds no tokenizer (no tokenizer.ggml.* metadata), which prepare needs to "
                        f"convert it into a model folder")
    try:
        why = truncation(path)
    except GGUFError as error:
        why = str(error).removeprefix(f"{path} ")
    if why is not None:
        problems.append(f"{key}: {path} is a damaged GGUF file ({why}); copy or download it again")
    return problems


def model_problems(name_or_path: str, accepts: Accepts, key: str = "model.name_or_path") -> list[str]:
    """Problems with the model that `name_or_path` names for the task of `accepts`: the offline default, a local
    folder or GGUF file, or a hub id."""
    if name_or_path in (DEFAULT, SCRATCH):
        return []
    path = Path(name_or_path).expanduser()
    gguf_file = local_gguf(path)
    if gguf_file is not None:
        return gguf_problems(gguf_file, key, accepts)
    if path.is_dir():
        return model_folder_problems(path, key, accepts)
    if path.exists():
        return [f"{key}: {path} is a file; expected a model folder (with {MODEL_CONFIG} and weights), a {SUFFIX} "
                f"file, a hub id, or default"]
    if looks_like_path(name_or_path):
        return [f"{key}: {missing_path(name_or_path)}; expected a model folder, a hub id, or default"]
    reason = hub_unreachable()
    if reason is not None:
        return [offline_advice(f"{key}: {name_or_path!r} is no local folder, so it names a Hugging Face hub model, "
                                f"but the hub is unreachable from here ({reason})")]
    return _hub_model_problems(name_or_path, key, accepts)


def model_shape(name_or_path: str) -> AttentionShape | None:
    """The attention of a local model, from its config.json or GGUF header (a decoder- or encoder-only stack: one
    site a layer); None where that is unknown before the model loads (a hub id, an encoder-decoder, other keys)."""
    path = Path(name_or_path).expanduser()
    gguf_file = local_gguf(path)
    try:
        if gguf_file is not None:
            architecture = read_metadata(gguf_file, ["general.architecture"]).get("general.architecture")
            keys = [f"{architecture}.{name}" for name in ("block_count", "attention.head_count",
                                                          "attention.head_count_kv")]
            values = read_metadata(gguf_file, keys)
            layers, heads, kv_heads = (values.get(k) for k in keys)
        elif (path / MODEL_CONFIG).is_file():
            config = json.loads((path / MODEL_CONFIG).read_text("utf-8"))
            if config.get("is_encoder_decoder"):
                return None
            layers, heads = config.get("num_hidden_layers"), config.get("num_attention_heads")
            kv_heads = config.get("num_key_value_heads")
        else:
            return None
    except (GGUFError, OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return None  # model_problems names what is wrong with the file
    if not (isinstance(layers, int) and isinstance(heads, int) and isinstance(kv_heads, int | None)):
        return None  # e.g. a GGUF that states heads layer by layer
    return AttentionShape.alike(layers, heads, kv_heads)


def level_problems(prune: PruneParams, shape: AttentionShape | None) -> list[str]:
    """The pruned models to save (prune.save_fractions, prune.kv_group_fractions) at levels the model's `shape`
    cannot take (pipeline/core/levels.py), when the shape is known before the model loads; the prune stage checks
    them all again."""
    if shape is None:
        return []
    problems = []
    wanted = [(f, prune.unit, prune.uniform, prune.min_heads_per_layer, "prune.save_fractions")
              for f in prune.save_fractions]
    wanted += [(f, "group", True, 0, "prune.kv_group_fractions") for f in prune.kv_group_fractions]  # serving shape
    for fraction, unit, uniform, min_heads, key in wanted:
        try:
            heads_to_save(fraction, shape, unit, uniform, min_heads, key)
        except LevelError as error:
            problems.append(str(error))
    return problems


def _hub_model_problems(repo_id: str, key: str, accepts: Accepts) -> list[str]:
    """The family of a hub model, from its config.json alone (a few KB), before prepare downloads the weights."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError

    try:
        config_file = Path(hf_hub_download(repo_id, MODEL_CONFIG))
    except HFValidationError as error:
        return [f"{key}: {repo_id!r} is neither a local folder nor a valid hub id ({error})"]
    except (HfHubHTTPError, OSError) as error:
        return [f"{key}: cannot fetch {repo_id}'s {MODEL_CONFIG} from the hub ({type(error).__name__}: "
                f"{str(error).splitlines()[0]})"]
    config = json.loads(config_file.read_text("utf-8"))
    problems = [line for line in [quantization_problem(config, repo_id, key)] if line]
    if config.get("model_type") not in FAMILIES:
        problems.append(f"{key}: {repo_id} is a {config.get('model_type')} model, which the head-surgery core does "
                        f"not support; supported families: {', '.join(sorted(FAMILIES))}")
    problems += _not_taken(config.get("model_type"), f"{repo_id} is a {config.get('model_type')} model", key, accepts)
    return problems


# --- what the families' data checks share -----------------------------------------------------------------------------


def read_source(path: Path) -> Table:
    """A local CSV/TSV/JSON(L) file of `data.source`, its problems named after that key."""
    try:
        return read_table(path)
    except InputError as error:
        raise InputError(f"data.source: {error}") from None


def hub_corpus_problems(source: str, corpora: dict[str, HubCorpus], config_kind: str, save_as: str) -> list[str]:
    """A `<corpus>/<config>` source on the hub: an unknown config, or the hub unreachable (with what to save)."""
    corpus, _, config = source.partition("/")
    if config not in corpora[corpus].pairs:
        return [f"data.source: unknown {corpus} {config_kind} {config!r}; allowed: {', '.join(corpora[corpus].pairs)}"]
    reason = hub_unreachable()
    return [] if reason is None else [offline_advice(
        f"data.source: {source} is read from the Hugging Face hub ({corpora[corpus].repo}), which is unreachable "
        f"from here ({reason}); save its {save_as} and point data.source at their folder")]


def check_carved_splits(train_size: int, given: set[str], fractions: tuple[float, ...], items: str,
                        out_of: str) -> None:
    """Each split carved out of train (no file of its own) gets at least one item by `data.fractions`."""
    f = check_fractions(fractions)
    carved = [s for s in SPLITS if s not in given]
    for split in carved:
        if train_size * f[SPLITS.index(split)] / (f[0] + sum(f[SPLITS.index(s)] for s in carved)) < 1:
            raise InputError(f"data: {split} would get no {items} out of {train_size} {out_of} by "
                             f"data.fractions {list(fractions)}; give more {items}, or a {split} file")


