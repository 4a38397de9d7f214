"""Save and load models whose heads and FFN neurons were physically pruned.

A pruned model is a Hugging Face folder (config, safetensors, tokenizer) plus `head_pruning.json`
(the name from before neurons could be pruned, kept so old folders still load), which records the
original indices of the heads each attention site kept and of the neurons each FFN site kept.

Two forms, and `save_model` writes the first whenever it can:
- **stock**: every layer pruned alike, into a shape the family's own config class describes and builds
  (`stock_config`: e.g. Qwen2 with 6 of 8 query heads and 2 key/value heads, `head_dim` given). The
  config says the pruned shape, so `AutoModelForCausalLM.from_pretrained` loads it with no project code;
  the record only tells this project which original heads and neurons are left.
- **project**: any other shape (layers pruned unequally, an emptied layer, a config class that derives
  head_dim from hidden_size / heads as BERT, GPT-2, OPT and Llama's validator do). The config is the
  unpruned one; `from_pretrained` refuses the smaller projections, so `load_model` builds the model from
  its config, prunes it to the recorded shape (`apply_pruning_record`), then loads the weights, checking
  each site's shape first so a mismatch names the site instead of a tensor. The record says why the
  folder is not stock.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from contextlib import nullcontext
from pathlib import Path

import torch
import transformers
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from pipeline.core.sites import PrunedShape, attention_sites, family_of, ffn_sites
from pipeline.core.surgery import prune_heads, prune_neurons
from pipeline.files.artifacts import reading
from pipeline.files.atomic import staged_dir
from pipeline.files.schema import NOT_STOCK_BECAUSE, PRUNING_FILE, STOCK

log = logging.getLogger("pipeline")

# 1: heads only ("sites"). 2: adds the FFN sites ("ffn_sites"); a version-1 record keeps every neuron.
# A version-2 record may also say the folder is stock ("stock": true, with each site's original_group_size).
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)


def pruning_record(model: nn.Module) -> dict:
    """What `model` kept of each attention site's heads and each FFN site's neurons, as JSON-ready data."""
    return {
        "format_version": FORMAT_VERSION,
        "sites": [
            {
                "kind": site.kind,
                "layer": site.layer,
                "original_num_heads": site.original_num_heads,
                "original_group_size": site.original_group_size,
                "kept_heads": site.kept_heads,
            }
            for site in attention_sites(model)
        ],
        "ffn_sites": [
            {
                "kind": site.kind,
                "layer": site.layer,
                "original_num_neurons": site.original_num_neurons,
                "kept_neurons": site.kept_neurons,
            }
            for site in ffn_sites(model)
        ],
    }


def _format_version(record: object, source: str | Path) -> int:
    if not isinstance(record, dict):
        raise ValueError(f"{source}: a pruning record is a JSON object, not {type(record).__name__}")
    version = record.get("format_version")
    if version not in READABLE_VERSIONS:
        raise ValueError(f"{source}: unsupported format_version {version!r}; this version reads "
                         f"{', '.join(map(str, READABLE_VERSIONS))}")
    return version


def _removal_plan(record: dict, key: str, unit: str, sites: list, source: str | Path) -> dict[int, list[int]]:
    """`{site index: [original indices to remove]}` that takes the model's sites (`attention_sites` or
    `ffn_sites`, with `kept_<unit>s` and `original_num_<unit>s`) to what `record[key]` says they kept.

    The record is checked entry by entry against the model, so a record from another model or a damaged
    one is refused with the site it disagrees on, before anything is pruned.
    """
    saved_sites = record.get(key)
    if not isinstance(saved_sites, list):
        raise ValueError(f"{source}: the pruning record has no '{key}' list")
    if len(saved_sites) != len(sites):
        raise ValueError(f"{source} records {len(saved_sites)} entries in '{key}' but the model has "
                         f"{len(sites)} such sites")
    kept_field, original_field = f"kept_{unit}s", f"original_num_{unit}s"
    plan = {}
    for index, (site, saved) in enumerate(zip(sites, saved_sites, strict=True)):
        where = f"{source}: '{key}' entry {index}"
        try:
            kind, layer, kept, original = saved["kind"], saved["layer"], saved[kept_field], saved[original_field]
        except (KeyError, TypeError) as error:
            raise ValueError(f"{where} lacks kind, layer, {kept_field} or {original_field}: {saved!r}") from error
        if (kind, layer) != (site.kind, site.layer):
            raise ValueError(f"{where} is recorded as {kind} layer {layer} but the model has {site.name} there")
        model_original = getattr(site, original_field)
        if original != model_original:
            raise ValueError(f"{where} ({site.name}) records {original} {unit}s originally but the model has "
                             f"{model_original}")
        present = getattr(site, kept_field)
        # Pruning keeps the original order, so a genuine record lists ascending indices the model still has.
        if (not isinstance(kept, list) or not all(isinstance(u, int) for u in kept)
                or kept != sorted(set(kept)) or not set(kept) <= set(present)):
            raise ValueError(f"{where} ({site.name}): {kept_field} must be ascending original indices among "
                             f"the {len(present)} the model has; got {kept!r}")
        plan[index] = sorted(set(present) - set(kept))
    return plan


def pruning_plan(model: nn.Module, record: dict, source: str | Path) -> dict[int, list[int]]:
    """The `prune_heads` plan that takes `model` (freshly built, or pruned less than the record) to the
    heads `record` (see `pruning_record`) says were kept. `source` names where the record came from, for
    the error messages."""
    _format_version(record, source)
    return _removal_plan(record, "sites", "head", attention_sites(model), source)


def neuron_pruning_plan(model: nn.Module, record: dict, source: str | Path) -> dict[int, list[int]]:
    """The `prune_neurons` plan that takes `model` to the FFN neurons `record` says were kept (none
    removed for a version-1 record, which predates neuron pruning)."""
    if _format_version(record, source) == 1:
        return {}
    return _removal_plan(record, "ffn_sites", "neuron", ffn_sites(model), source)


def apply_pruning_record(model: nn.Module, record: dict, source: str | Path) -> nn.Module:
    """Prune `model` (freshly built from the same config, or pruned less than the record) to the heads
    and neurons `record` keeps. Both plans are checked before either is applied, so a bad record leaves
    the model unchanged. Returns the model, modified in place."""
    heads = pruning_plan(model, record, source)
    neurons = neuron_pruning_plan(model, record, source)
    prune_heads(model, heads)
    return prune_neurons(model, neurons)


def check_pruned_shapes(model: nn.Module, weights: Mapping[str, torch.Tensor], source: str | Path,
                        root: nn.Module | None = None, error: type[Exception] = ValueError) -> None:
    """Raise `error` naming the site when `weights` (a state dict of `root`, default `model`) do not have
    the shapes of `model`'s pruned sites, so a record that disagrees with its weights says where."""
    names = {id(param): name for name, param in (root or model).named_parameters()}

    def held(key: str) -> str:
        return "no tensor" if key not in weights else f"a {list(weights[key].shape)} tensor"

    for index, site in enumerate(attention_sites(model)):
        param = site.projections[0].weight
        key = names[id(param)]
        if key not in weights or weights[key].shape != param.shape:
            raise error(f"{source}: site {index} ({site.name}) records {site.num_heads} heads (a {list(param.shape)} "
                        f"query weight), but the weights hold {held(key)} for {key}")
    for index, site in enumerate(ffn_sites(model)):
        param = site.fc_in.weight
        key = names[id(param)]
        if key not in weights or weights[key].shape != param.shape:
            raise error(f"{source}: FFN site {index} ({site.name}) records {site.num_neurons} neurons (a "
                        f"{list(param.shape)} weight), but the weights hold {held(key)} for {key}")


def _is_pruned(model: nn.Module) -> bool:
    return (any(site.num_heads != site.original_num_heads for site in attention_sites(model))
            or any(site.num_neurons != site.original_num_neurons for site in ffn_sites(model)))


def stock_config(model: nn.Module) -> tuple[transformers.PretrainedConfig | None, str]:
    """The config under which the family's own class builds exactly `model`'s pruned shape, so that stock
    `from_pretrained` loads it; or `(None, why not)`. An unpruned model's config is its own."""
    if not _is_pruned(model):
        return model.config, ""
    family, sites, ffns = family_of(model), attention_sites(model), ffn_sites(model)
    config_class = type(model.config)
    if family.stock_keys is None:
        return None, f"{config_class.__name__} has no keys for a pruned shape (encoder-decoder attention)"
    heads = sorted({(site.num_heads, site.num_kv_heads) for site in sites})
    widths = sorted({site.num_neurons for site in ffns})
    if len(heads) > 1 or len(widths) > 1:
        return None, (f"its layers differ ((query, key/value) heads per layer: {[h for h, _ in heads]} / "
                      f"{[kv for _, kv in heads]}; FFN widths {widths}), and a stock config gives every layer one "
                      f"shape; prune with uniform: true for a stock folder")
    (num_heads, num_kv_heads), = heads
    if num_heads == 0 or widths[0] == 0:
        return None, "every layer lost all its heads or neurons, which a stock config cannot say"
    updates = family.stock_keys(PrunedShape(num_heads, num_kv_heads, sites[0].head_dim, widths[0]))
    # The config classes' validators (StrictDataclassError) and some model constructors (ValueError) refuse shapes.
    try:
        config = config_class.from_dict({**model.config.to_dict(), **updates})
        with torch.device("meta"):
            built = type(model)(config)
    except (ValueError, TypeError, StrictDataclassError) as error:
        reason = str(error).strip().splitlines()[-1].strip()
        return None, f"{config_class.__name__} refuses {updates}: {reason}"
    config.architectures = [type(model).__name__]  # what save_pretrained records, so Auto* picks this class
    expected = dict(model.state_dict())
    for key, tensor in built.state_dict().items():
        if key in expected and tensor.shape != expected[key].shape:
            return None, (f"{config_class.__name__} with {updates} builds {key} as {list(tensor.shape)}, not the "
                          f"pruned {list(expected[key].shape)}")
    return config, ""


def save_model(model: nn.Module, path: str | Path, tokenizer=None) -> Path:
    """Write `model` (pruned or not) and optionally its tokenizer to the folder `path`, atomically:
    a killed save leaves the previous folder (or none), never a half-written one.

    A stock Hugging Face folder whenever the pruned shape allows one (`stock_config`), else the project's
    form; the pruning record says which, and why a stock load is impossible."""
    config, why_not = stock_config(model)
    record = pruning_record(model)
    record[STOCK] = config is not None
    if config is None:
        record[NOT_STOCK_BECAUSE] = why_not
        log.info("save: %s is in the project's format (load it with pipeline.core.checkpoint.load_model): %s",
                 path, why_not)
    with staged_dir(path) as staging:
        model.save_pretrained(staging)
        if config is not None and config is not model.config:
            config.save_pretrained(staging)  # the pruned shape, over the unpruned config save_pretrained wrote
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        (staging / PRUNING_FILE).write_text(json.dumps(record, indent=1) + "\n")
    return Path(path)


def _annotate_stock_load(model: nn.Module, record: dict, source: Path) -> None:
    """Give a model that stock `from_pretrained` built in its pruned shape the original indices `record`
    keeps, so later plans (in original indices) and records stay right."""
    sites, ffns = attention_sites(model), ffn_sites(model)
    saved_sites, saved_ffns = record.get("sites"), record.get("ffn_sites")
    if not isinstance(saved_sites, list) or not isinstance(saved_ffns, list) or (
            len(saved_sites), len(saved_ffns)) != (len(sites), len(ffns)):
        raise ValueError(f"{source}: a stock record lists one entry per attention and FFN site of the model "
                         f"({len(sites)} and {len(ffns)})")
    for site, saved in zip(sites, saved_sites, strict=True):
        kept = saved.get("kept_heads") if isinstance(saved, dict) else None
        if not isinstance(kept, list) or len(kept) != site.num_heads:
            raise ValueError(f"{source}: {site.name} has {site.num_heads} heads, the record keeps {kept!r}")
        if kept == list(range(saved["original_num_heads"])):
            continue  # unpruned: left as a fresh model, so a later prune_heads sets it up as for any other
        site.module.original_num_heads = saved["original_num_heads"]
        site.module.original_group_size = saved.get("original_group_size", 1)
        site.module.kept_heads = kept
    for site, saved in zip(ffns, saved_ffns, strict=True):
        kept = saved.get("kept_neurons") if isinstance(saved, dict) else None
        if not isinstance(kept, list) or len(kept) != site.num_neurons:
            raise ValueError(f"{source}: {site.name} has {site.num_neurons} neurons, the record keeps "
                             f"{len(kept) if isinstance(kept, list) else kept!r}")
        if kept == list(range(saved["original_num_neurons"])):
            continue
        site.fc_in.original_num_neurons = saved["original_num_neurons"]
        site.fc_in.kept_neurons = kept


def _model_class(config: transformers.PretrainedConfig) -> type:
    architectures = getattr(config, "architectures", None) or []
    for name in architectures:
        if hasattr(transformers, name):
            return getattr(transformers, name)
    return transformers.AutoModel


def _load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        with reading(index, json.JSONDecodeError, KeyError, TypeError, AttributeError):
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        shards = ["model.safetensors"]
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        with reading(path / shard, SafetensorError):
            state.update(load_file(path / shard))
    return state


def read_pruning_record(record_file: Path) -> dict | None:
    """The folder's pruning record, None where it has none; a damaged one raises ValueError naming the file."""
    if not record_file.exists():
        return None
    with reading(record_file, ValueError):
        try:
            record = json.loads(record_file.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{record_file}: not a valid pruning record (bad JSON: {error})") from error
        _format_version(record, record_file)
    return record


def load_model(path: str | Path, model_class: type | None = None, trust_remote_code: bool = False,
               **kwargs) -> nn.Module:
    """Load a pruned folder written by `save_model`, an ordinary Hugging Face folder, or a hub id.

    `model_class` defaults to the class named in the config's `architectures`; `kwargs` go to the
    model's constructor (e.g. `attn_implementation="eager"`). `trust_remote_code` lets Hugging Face run the
    Python code a model folder ships (the `model.trust_remote_code` param). Returns the model in eval mode.
    A truncated weights file or a damaged pruning record raises `DamagedArtifact`, naming the file.
    """
    local = Path(path)
    record_file = local / PRUNING_FILE
    record = read_pruning_record(record_file)
    if record is None or record.get(STOCK):
        config = transformers.AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
        cls = model_class or _model_class(config)
        weights = local / "model.safetensors"
        # A hub id or a sharded folder names no single weights file; let from_pretrained report those as it does.
        with reading(weights, SafetensorError) if weights.exists() else nullcontext():
            model = cls.from_pretrained(str(path), trust_remote_code=trust_remote_code, **kwargs).eval()
        if record is not None:
            with reading(record_file, ValueError):
                _annotate_stock_load(model, record, record_file)
        return model

    config = transformers.AutoConfig.from_pretrained(local, trust_remote_code=trust_remote_code)
    cls = model_class or _model_class(config)
    model = cls._from_config(config, **kwargs)
    state = _load_state_dict(local)
    # The record's checks raise ValueError naming it: a record that disagrees with its config or weights is damaged.
    with reading(record_file, ValueError):
        apply_pruning_record(model, record, record_file)
        check_pruned_shapes(model, state, record_file)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied weights are saved once; some buffers-as-weights (Marian's sinusoidal positions) never are.
    tied = set(getattr(model, "all_tied_weights_keys", {}) or {})
    ignorable = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_missing", None) or []]
    untied_missing = [k for k in missing if k not in tied and not any(p.search(k) for p in ignorable)]
    if untied_missing or unexpected:
        raise ValueError(f"{local}: weights do not match the model: missing {untied_missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    model.tie_weights()
    return model.eval()


def model_skeleton(path: str | Path, trust_remote_code: bool = False, **kwargs) -> nn.Module:
    """The model `load_model` builds from the folder `path`, pruned to its record's shape, with every parameter on
    the meta device: the structure and no weights, for code that reads the weights from the folder's safetensors
    one part at a time (pipeline/core/layerwise.py). Buffers are real (accelerate's `init_empty_weights` leaves
    them), so rotary frequencies are computed as a whole load computes them. In eval mode."""
    from accelerate import init_empty_weights  # only this path needs accelerate, which is slow to import

    local = Path(path)
    record_file = local / PRUNING_FILE
    record = read_pruning_record(record_file)
    config = transformers.AutoConfig.from_pretrained(local, trust_remote_code=trust_remote_code)
    with init_empty_weights():
        model = _model_class(config)._from_config(config, **kwargs)
    if record is not None:
        with reading(record_file, ValueError):
            if record.get(STOCK):  # the config already says the pruned shape
                _annotate_stock_load(model, record, record_file)
            else:  # surgery on meta tensors: the shapes change, no weight is read
                apply_pruning_record(model, record, record_file)
    return model.eval()
