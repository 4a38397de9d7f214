"""A decoder-only language model run one decoder layer at a time, as SliceGPT and Wanda calibrate: the weights stay
on the CPU or on disk, each layer's weights are on the device only while that layer runs, and the calibration
activations (the hidden states at each layer boundary) are carried forward and kept on the CPU.

Head importance is exact this way, not approximated. The gate gradients of layer l depend only on layer l's input
and on dL/d(output of layer l); so a forward pass stores every layer's input, the loss is taken at the top (the
model's own final norm, head and `per_example_loss`), and a backward walk recomputes each layer from its stored
input with the head gates attached, backpropagates the upstream gradient through that layer alone, reads the gates'
gradients and passes dL/d(input) down. Every number is computed by the same operations, in the same order, as one
backward pass of the whole model (pipeline/core/importance.py), so the scores agree to floating-point rounding.

What is model-specific is left to the model's own code: the embeddings, the attention masks, the rotary or learned
positions and the final norm and head run inside the model's `forward`, whose decoder layers are swapped for
stand-ins. A first pass records what `forward` hands each layer besides its hidden states (the mask, the position
embeddings; per layer, so Gemma 3's sliding and full layers get their own); the last pass hands `forward` the top
hidden states and reads the loss. So every decoder-only family of pipeline/core/sites.py runs unchanged.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from tqdm.auto import tqdm

from pipeline.core.checkpoint import model_skeleton
from pipeline.core.gates import head_gates
from pipeline.core.importance import example_gate_sums, frozen_for_gate_gradients, per_example_loss, token_gate_sums
from pipeline.core.sites import attention_sites, is_decoder_only, layer_stack
from pipeline.files.artifacts import MissingArtifact
from pipeline.files.schema import DECODER

Batch = Mapping[str, torch.Tensor]
MODEL_INPUTS = ("input_ids", "attention_mask")  # what the layers' inputs depend on (labels only enter the loss)


@dataclass
class LayerCall:
    """What the model's `forward` passes a decoder layer besides its hidden states, kept on the CPU."""

    args: tuple
    kwargs: dict


class _TopReached(Exception):
    """Raised by the last layer's stand-in once every layer's call is recorded: the head need not run."""


def _moved(value: object, device: torch.device | str) -> object:
    """`value` with every tensor in it (inside tuples, lists and dicts) on `device`."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_moved(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _moved(v, device) for k, v in value.items()}
    return value


def _output(result: object) -> torch.Tensor:
    """A decoder layer's hidden states (transformers 5's layers return the tensor; older ones a tuple)."""
    return result[0] if isinstance(result, tuple) else result


@contextmanager
def _stand_ins(layers: nn.ModuleList, forward: Callable[[int, torch.Tensor, tuple, dict], torch.Tensor]
               ) -> Iterator[None]:
    """Each layer's `forward` replaced by `forward(index, hidden_states, args, kwargs)` for the block."""
    for index, layer in enumerate(layers):
        def stand_in(_self: nn.Module, hidden_states: torch.Tensor, *args, index: int = index, **kwargs
                     ) -> torch.Tensor:
            return forward(index, hidden_states, args, kwargs)

        layer.forward = types.MethodType(stand_in, layer)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward  # the class's forward again


class LayerwiseModel:
    """A decoder-only causal LM whose decoder layers run one at a time on `device`.

    `from_folder`: a skeleton on the meta device and a safetensors folder; each part's tensors are read from disk
    onto the device while it runs (in the dtype stored, as `load_model` keeps it), then dropped. `in_memory`: a model
    whose weights are in memory (on the CPU), each part moved to the device while it runs (on the CPU device: used
    where it is). Between parts, nothing of the weights is on the device.
    """

    def __init__(self, model: nn.Module, device: torch.device | str,
                 fetch: Callable[[str, torch.Tensor], torch.Tensor]) -> None:
        if not is_decoder_only(model):
            raise ValueError("layerwise scoring runs decoder-only language models (Llama, Qwen, Mistral, Gemma 3, "
                             "OPT, GPT-2); this model has other attention")
        self.model, self.device, self._fetch = model, torch.device(device), fetch
        self.layers = layer_stack(model, DECODER)
        self.sites = attention_sites(model)
        names = {id(module): name for name, module in model.named_modules()}
        layer_names = [names[id(layer)] for layer in self.layers]
        self._layer_tensors = [_tensor_groups([(name, layer)]) for name, layer in zip(layer_names, self.layers,
                                                                                        strict=True)]
        # The rest: embeddings, final norm, head, rotary frequencies; what runs below the first and above the last
        # layer.
        in_layers = {id(t) for group in self._layer_tensors for t, _ in group.values()}
        self._rest_tensors = {key: value for key, value in _tensor_groups([("", model)]).items()
                              if key not in in_layers}

    @classmethod
    def from_folder(cls, path: str | Path, device: torch.device | str = "cpu", trust_remote_code: bool = False,
                    **kwargs) -> LayerwiseModel:
        """The model of the folder `path` (as `load_model` builds it; `kwargs` go to its constructor), its weights
        read from the folder's safetensors file(s) a part at a time."""
        folder = Path(path)
        files = _tensor_files(folder)
        skeleton = model_skeleton(folder, trust_remote_code=trust_remote_code, **kwargs)
        tied = {**getattr(skeleton, "all_tied_weights_keys", {})}

        def fetch(name: str, original: torch.Tensor) -> torch.Tensor:
            if original.device.type != "meta":  # a buffer built at construction (rotary frequencies)
                return original.to(device)
            key = name if name in files else tied.get(name)
            if key not in files:
                raise ValueError(f"{folder}: the weights hold no tensor {name}")
            # safe_open maps the file for this read only: once closed, none of its pages count as this process's.
            with safe_open(files[key], framework="pt", device=str(torch.device(device))) as handle:
                return handle.get_tensor(key)

        return cls(skeleton, device, fetch)

    @classmethod
    def in_memory(cls, model: nn.Module, device: torch.device | str = "cpu") -> LayerwiseModel:
        """`model`, its weights where they are (the CPU), each part on `device` only while it runs."""
        return cls(model, device, lambda _name, original: original.to(device))

    def sites_of(self, layer: int) -> list[int]:
        """The indices (in `sites`) of layer `layer`'s attention sites."""
        return [i for i, site in enumerate(self.sites) if site.layer == layer]

    @contextmanager
    def _on_device(self, groups: Mapping[int, tuple[torch.Tensor, list]]) -> Iterator[None]:
        """The tensors of `groups` fetched onto the device for the block, then the originals put back, so that the
        fetched copies are freed."""
        for original, owners in groups.values():
            _, _, name, is_param = owners[0]
            fetched = self._fetch(name, original)
            fetched = nn.Parameter(fetched, requires_grad=False) if is_param else fetched  # tied owners share it
            for module, attr, _, param in owners:
                (module._parameters if param else module._buffers)[attr] = fetched
        try:
            yield
        finally:
            for original, owners in groups.values():
                for module, attr, _, param in owners:
                    (module._parameters if param else module._buffers)[attr] = original

    def layer_on_device(self, layer: int) -> AbstractContextManager:
        return self._on_device(self._layer_tensors[layer])

    def rest_on_device(self) -> AbstractContextManager:
        return self._on_device(self._rest_tensors)

    # --- the three passes -------------------------------------------------------------------------------------------
    def layer_calls(self, batch: Batch) -> tuple[torch.Tensor, list[LayerCall]]:
        """The first layer's input of `batch` and what `forward` passes each layer besides it, on the CPU (the rest
        of the model on the device)."""
        inputs = {k: batch[k].to(self.device) for k in MODEL_INPUTS if k in batch}
        first: list[torch.Tensor] = []
        calls: list[LayerCall | None] = [None] * len(self.layers)

        def record(index: int, hidden: torch.Tensor, args: tuple, kwargs: dict) -> torch.Tensor:
            if index == 0:
                first.append(hidden.detach().cpu())
            calls[index] = LayerCall(_moved(args, "cpu"), _moved(kwargs, "cpu"))
            if index == len(self.layers) - 1:
                raise _TopReached
            return hidden

        with torch.no_grad(), _stand_ins(self.layers, record):
            try:
                self.model(**inputs, use_cache=False)
            except _TopReached:
                pass
        return first[0], calls

    def run_layer(self, layer: int, hidden: torch.Tensor, call: LayerCall) -> torch.Tensor:
        """Layer `layer` (on the device) on `hidden`, as the whole model's `forward` calls it."""
        return _output(self.layers[layer](hidden, *_moved(call.args, self.device),
                                          **_moved(call.kwargs, self.device)))

    def loss_gradient(self, batch: Batch, top: torch.Tensor) -> torch.Tensor:
        """dL/d(top) for the last layer's output `top` of `batch`, L the sum of `per_example_loss`: the model's own
        `forward` above its layers (final norm, head) and the same loss as the whole model's, on the CPU."""
        leaf = top.to(self.device).detach().requires_grad_(True)

        def top_states(index: int, hidden: torch.Tensor, _args: tuple, _kwargs: dict) -> torch.Tensor:
            return leaf if index == 0 else hidden  # the first stand-in hands up the top states, the others pass them

        with _stand_ins(self.layers, top_states):
            loss = per_example_loss(self.model, {k: v.to(self.device) for k, v in batch.items()})
        (grad,) = torch.autograd.grad(loss.sum(), leaf)
        return grad.cpu()


def _tensor_groups(modules: Sequence[tuple[str, nn.Module]]) -> dict[int, tuple[torch.Tensor, list]]:
    """Every parameter and buffer under `modules`, keyed by the tensor's id (tied weights: one key, all owners):
    (the tensor, [(owning module, attribute, full name, is a parameter)])."""
    groups: dict[int, tuple[torch.Tensor, list]] = {}
    for base, root in modules:
        for name, module in root.named_modules(prefix=base, remove_duplicate=False):
            for store, is_param in ((module._parameters, True), (module._buffers, False)):
                for attr, tensor in store.items():
                    if tensor is not None:
                        full = f"{name}.{attr}" if name else attr
                        groups.setdefault(id(tensor), (tensor, []))[1].append((module, attr, full, is_param))
    return groups


def _tensor_files(folder: Path) -> dict[str, Path]:
    """The safetensors file holding each tensor of a model folder (one file, or the shards of an index)."""
    if not folder.is_dir():
        raise MissingArtifact(folder)
    paths = sorted(folder.glob("*.safetensors"))
    if not paths:
        raise MissingArtifact(folder / "model.safetensors")
    files = {}
    for path in paths:
        with safe_open(path, framework="pt") as handle:
            files.update(dict.fromkeys(handle.keys(), path))
    return files


# --- the passes over the calibration batches --------------------------------------------------------------------------
def carry_forward(lm: LayerwiseModel, batches: Sequence[Batch], keep: bool = True,
                  watch: Callable[[int, int], AbstractContextManager] | None = None, progress: bool = False
                  ) -> tuple[list[list[torch.Tensor]], list[list[LayerCall]]]:
    """Every batch through the layers, one layer on the device at a time: (states, calls), where `states[l][b]` is
    batch b's input of layer l (`states[-1]`: the last layer's output) on the CPU, and `calls[b][l]` what layer l is
    passed besides. Without `keep` only the last boundary is kept (a forward-only criterion needs no more).
    `watch(layer, b)` is entered around each layer's run on batch b (to attach hooks that read it)."""
    with torch.no_grad():
        with lm.rest_on_device():
            firsts, calls = zip(*(lm.layer_calls(batch) for batch in batches), strict=True)
        states = [list(firsts)]
        for layer in tqdm(range(len(lm.layers)), desc="layers", disable=not progress, leave=False):
            outputs = []
            with lm.layer_on_device(layer):
                for b, hidden in enumerate(states[-1]):
                    with watch(layer, b) if watch is not None else nullcontext():
                        outputs.append(lm.run_layer(layer, hidden.to(lm.device), calls[b][layer]).cpu())
            states = [*states, outputs] if keep else [outputs]
    return states, list(calls)


def _gate_gradient_sums(lm: LayerwiseModel, batches: Sequence[Batch], per_position: bool,
                        batches_per_pass: int | None, progress: bool
                        ) -> tuple[list[list[torch.Tensor]], int, int]:
    """Per site, the sums over `batches` of `example_gate_sums` (per-example gates) or of both of `token_gate_sums`
    (per-position gates), by the forward pass, the loss at the top and the backward walk; and the examples and real
    tokens seen. Sums run over the batches in order, as the whole model's do. `batches_per_pass` batches go through
    the layers together (None: all): their stored layer inputs are what the CPU holds, and each pass reads every
    layer's weights twice."""
    if not batches:
        raise ValueError("layerwise importance got no batches: the scoring data is empty")
    totals: list[list[torch.Tensor]] = [[] for _ in lm.sites]  # per site: one running sum per estimator
    examples = tokens = 0
    step = batches_per_pass or len(batches)
    with frozen_for_gate_gradients(lm.model):
        for start in range(0, len(batches), step):
            part = batches[start : start + step]
            states, calls = carry_forward(lm, part, progress=progress)
            with lm.rest_on_device():
                grads = [lm.loss_gradient(batch, top) for batch, top in zip(part, states.pop(), strict=True)]
            for batch in part:
                examples += batch["input_ids"].shape[0]
                tokens += int(_real_tokens(batch).sum())
            for layer in reversed(range(len(lm.layers))):
                inputs, indices = states.pop(), lm.sites_of(layer)
                with lm.layer_on_device(layer), head_gates(lm.layers[layer], sites=[lm.sites[i] for i in indices]
                                                           ) as gates:
                    for b, batch in enumerate(part):
                        # The first layer's input is the embedding: nothing below it to pass a gradient to.
                        hidden = inputs[b].to(lm.device).detach().requires_grad_(layer > 0)
                        size, length = batch["input_ids"].shape
                        leaves = gates.per_position(size, length) if per_position else gates.per_example(size)
                        output = lm.run_layer(layer, hidden, calls[b][layer])
                        if output.requires_grad:  # not when the layer's heads are all pruned, and it is the first
                            torch.autograd.backward(output, grads[b].to(lm.device))
                        sums = (token_gate_sums(leaves, _real_tokens(batch).to(lm.device)) if per_position
                                else (example_gate_sums(leaves),))
                        for i, per_estimator in zip(indices, zip(*sums, strict=True), strict=True):
                            totals[i] = ([t + s for t, s in zip(totals[i], per_estimator, strict=True)] if totals[i]
                                         else list(per_estimator))
                        if layer:
                            grads[b] = hidden.grad.cpu() if hidden.grad is not None else torch.zeros_like(inputs[b])
    return [[t.detach().cpu() for t in site] for site in totals], examples, tokens


def _real_tokens(batch: Batch) -> torch.Tensor:
    """The batch's `[batch, positions]` float mask of real tokens (all of them without an attention mask)."""
    ids = batch["input_ids"]
    return batch.get("attention_mask", torch.ones_like(ids)).to(torch.float32)


def layerwise_head_importance(lm: LayerwiseModel, batches: Sequence[Batch], progress: bool = True,
                              batches_per_pass: int | None = None) -> list[torch.Tensor]:
    """`head_importance` (the paper's E_x |dL(x)/d(xi_h)|) computed one layer at a time: the same scores."""
    sums, examples, _ = _gate_gradient_sums(lm, batches, False, batches_per_pass, progress)
    return [site[0] / examples for site in sums]


def layerwise_token_head_importance(lm: LayerwiseModel, batches: Sequence[Batch], progress: bool = True,
                                    batches_per_pass: int | None = None
                                    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """`token_head_importance` (per token, per example) computed one layer at a time: the same scores."""
    sums, examples, tokens = _gate_gradient_sums(lm, batches, True, batches_per_pass, progress)
    return [site[0] / tokens for site in sums], [site[1] / examples for site in sums]
