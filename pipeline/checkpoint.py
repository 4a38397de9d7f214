"""Save and load models whose heads were physically pruned.

A pruned model is an ordinary Hugging Face folder (config, safetensors, tokenizer) plus
`head_pruning.json`, which records the original indices of the heads each attention site kept.
`from_pretrained` alone cannot load such a folder (it refuses the smaller projections), so
`load_model` builds the model from its config, prunes it to the recorded shape, then loads the
weights, checking each site's shape first so a mismatch names the site instead of a tensor.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file
from torch import nn

from pipeline.sites import attention_sites
from pipeline.surgery import prune_heads

PRUNING_FILE = "head_pruning.json"
FORMAT_VERSION = 1


def pruning_record(model: nn.Module) -> dict:
    return {
        "format_version": FORMAT_VERSION,
        "sites": [
            {
                "kind": site.kind,
                "layer": site.layer,
                "original_num_heads": getattr(site.module, "original_num_heads", site.num_heads),
                "kept_heads": site.kept_heads,
            }
            for site in attention_sites(model)
        ],
    }


def pruning_plan(model: nn.Module, record: dict, source: str | Path) -> dict[int, list[int]]:
    """The plan that prunes `model`, freshly built and unpruned, to the heads `record` (see `pruning_record`)
    says were kept. `source` names where the record came from, for the error messages."""
    if record.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{source}: unsupported format_version {record.get('format_version')!r}; "
                         f"this version reads {FORMAT_VERSION}")
    sites = attention_sites(model)
    if len(record["sites"]) != len(sites):
        raise ValueError(f"{source} records {len(record['sites'])} attention sites but the "
                         f"{type(model).__name__} config builds {len(sites)}")
    plan = {}
    for index, (site, saved) in enumerate(zip(sites, record["sites"], strict=True)):
        if (saved["kind"], saved["layer"]) != (site.kind, site.layer):
            raise ValueError(f"{source}: site {index} is recorded as {saved['kind']} layer "
                             f"{saved['layer']} but the model has {site.name} there")
        plan[index] = sorted(set(range(site.num_heads)) - set(saved["kept_heads"]))
    return plan


def save_model(model: nn.Module, path: str | Path, tokenizer=None) -> Path:
    """Write `model` (pruned or not) and optionally its tokenizer to the folder `path`, atomically:
    a killed save leaves the previous folder (or none), never a half-written one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        model.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        (staging / PRUNING_FILE).write_text(json.dumps(pruning_record(model), indent=1) + "\n")
        _replace_dir(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path


def _replace_dir(new: Path, target: Path) -> None:
    if target.exists():
        old = target.with_name(f".{target.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
        os.replace(new, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(new, target)


def _model_class(config: transformers.PretrainedConfig) -> type:
    architectures = getattr(config, "architectures", None) or []
    for name in architectures:
        if hasattr(transformers, name):
            return getattr(transformers, name)
    return transformers.AutoModel


def _load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        shards = ["model.safetensors"]
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        state.update(load_file(path / shard))
    return state


def load_model(path: str | Path, model_class: type | None = None, **kwargs) -> nn.Module:
    """Load a pruned folder written by `save_model`, an ordinary Hugging Face folder, or a hub id.

    `model_class` defaults to the class named in the config's `architectures`; `kwargs` go to the
    model's constructor (e.g. `attn_implementation="eager"`). Returns the model in eval mode.
    """
    local = Path(path)
    record_file = local / PRUNING_FILE
    if not record_file.exists():
        config = transformers.AutoConfig.from_pretrained(str(path))
        cls = model_class or _model_class(config)
        return cls.from_pretrained(str(path), **kwargs).eval()

    record = json.loads(record_file.read_text())
    config = transformers.AutoConfig.from_pretrained(local)
    cls = model_class or _model_class(config)
    model = cls._from_config(config, **kwargs)
    prune_heads(model, pruning_plan(model, record, record_file))

    state = _load_state_dict(local)
    names = {id(param): name for name, param in model.named_parameters()}
    for index, site in enumerate(attention_sites(model)):
        key = names[id(site.projections[0].weight)]
        expected = site.num_heads * site.head_dim
        found = state[key].shape[0] if key in state else None
        if found != expected:
            raise ValueError(
                f"{local}: site {index} ({site.name}) records {site.num_heads} heads "
                f"({expected} query rows) in {PRUNING_FILE}, but the weights hold "
                f"{'no tensor' if found is None else f'{found} rows'} for {key}"
            )
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
