"""Models larger than one device (`runtime.placement: sharded`): accelerate's big-model placement.

A sharded model is loaded with `device_map="auto"` within `runtime.max_memory`: its layers go to the GPUs in order,
then to the CPU, then to disk (an offload folder), whatever the caps leave. accelerate hooks each placed block so
that its inputs move to the block's execution device and, for CPU- or disk-offloaded blocks, the weights are
brought there for the forward pass only (their parameters otherwise sit on the "meta" device). So the code that runs
a model must not ask its first parameter where it lives: `input_device` says where its inputs go.

Stock Hugging Face folders (base models, and pruned folders in a shape the config class describes) stream their
weights straight to their places (`from_pretrained`); a folder in the project's pruned format
(pipeline/core/checkpoint.py) is built whole on the CPU first, then dispatched the same way.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import weakref
from pathlib import Path

import torch
from accelerate import dispatch_model, infer_auto_device_map
from torch import nn

from pipeline.core.checkpoint import load_model
from pipeline.core.runtime import Runtime
from pipeline.files.schema import PRUNING_FILE, STOCK

OFFLOADED = ("cpu", "disk")  # device_map values that are not an execution device when a GPU is in the map


def device_map(model: nn.Module) -> dict[str, int | str]:
    """accelerate's placement of `model`'s modules (`hf_device_map`); empty for a model on one device."""
    return dict(getattr(model, "hf_device_map", None) or {})


def _as_device(value: int | str | torch.device) -> torch.device:
    return torch.device("cuda", value) if isinstance(value, int) else torch.device(value)


def input_device(model: nn.Module) -> torch.device:
    """Where `model`'s inputs go: for a dispatched model, the execution device of its first placed module (the
    embeddings); a CPU- or disk-offloaded one runs on the map's first GPU (accelerate's main device), or the CPU
    when there is none. Otherwise, the device of its first parameter that holds data."""
    placed = device_map(model)
    if placed:
        first = next(iter(placed.values()))
        if first not in OFFLOADED:
            return _as_device(first)
        gpus = [d for d in placed.values() if d not in OFFLOADED]
        return _as_device(gpus[0]) if gpus else torch.device("cpu")
    for param in model.parameters():
        if param.device.type != "meta":
            return param.device
    return torch.device("cpu")


def _is_stock_folder(path: Path) -> bool:
    """Whether `from_pretrained` can build the folder's model: no pruning record, or one that says it is stock."""
    record = path / PRUNING_FILE
    if not record.exists():
        return True
    try:
        return bool(json.loads(record.read_text()).get(STOCK))
    except (json.JSONDecodeError, AttributeError):
        return False  # load_model reads it again and names the damage


def _offload_folder(offload_root: Path, path: Path) -> Path:
    """A fresh folder for one load's disk-offloaded weights: models loaded side by side (the benchmark's) write
    tensors of the same names, so each gets its own."""
    offload_root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{path.name}-", dir=offload_root))


def load_sharded(path: str | Path, runtime: Runtime, offload_root: Path, trust_remote_code: bool = False,
                 **kwargs) -> nn.Module:
    """The model folder `path` placed by accelerate within `runtime.memory_caps` (no caps: every GPU's and the
    CPU's free memory), with disk-offloaded weights in a fresh folder under `offload_root` that is deleted when the
    model is. `kwargs` go to the model's constructor (`attn_implementation`). In eval mode."""
    path = Path(path)
    caps = runtime.memory_caps or None
    offload = _offload_folder(offload_root, path)
    if _is_stock_folder(path):
        model = load_model(path, trust_remote_code=trust_remote_code, device_map="auto", max_memory=caps,
                           offload_folder=str(offload), **kwargs)
    else:
        whole = load_model(path, trust_remote_code=trust_remote_code, **kwargs)
        placed = infer_auto_device_map(whole, max_memory=caps,
                                       no_split_module_classes=getattr(whole, "_no_split_modules", None) or [])
        model = dispatch_model(whole, placed, offload_dir=str(offload))
        model.hf_device_map = placed
    weakref.finalize(model, shutil.rmtree, offload, ignore_errors=True)
    return model.eval()
