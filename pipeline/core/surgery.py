"""Physical pruning of heads and FFN neurons: remove their parameters for real, so the model gets
faster and smaller.

A head h owns rows `[h*d, (h+1)*d)` of the query projection and the same columns of the output
projection's input; in multi-head attention it owns the same rows of the key and value projections.
Under grouped-query attention a key/value head serves a group of query heads: it goes when the last
of them goes, and every group must keep the same number of query heads, because the attention repeats
each key/value head `group size` times (`validate_heads_to_prune` refuses any other plan, naming the
layer; `pipeline.core.importance.select_heads` only makes valid ones). Pruning slices the rows out and
updates the head-count attributes the module reshapes with. When every head of a site goes, its forward
is replaced by one that returns only the output projection's bias, because the stock forwards reshape
with `-1` and cannot run on zero heads.

An FFN neuron i owns output i of the block's input linears (one, or two in a gated block) and input i
of its output linear. No family's FFN reshapes with its width, so a block with every neuron gone runs
its stock forward: zero-width linears, whose output is the output linear's bias.

GPT-2's `Conv1D` is a linear with its weight stored transposed (`[in, out]`); the slicing below
handles both.
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from pipeline.core.sites import AttentionSite, FeedForwardSite, attention_sites, ffn_sites


def _transposed(layer: nn.Module) -> bool:
    """GPT-2's Conv1D stores its weight as `[in, out]`; nn.Linear as `[out, in]`."""
    return not isinstance(layer, nn.Linear)


def _keep_rows(layer: nn.Module, index: torch.Tensor) -> None:
    """Keep the outputs `index` of a linear (and their biases)."""
    layer.weight = nn.Parameter(layer.weight.data.index_select(1 if _transposed(layer) else 0, index).clone(),
                                requires_grad=layer.weight.requires_grad)
    if layer.bias is not None:
        layer.bias = nn.Parameter(layer.bias.data.index_select(0, index).clone(),
                                  requires_grad=layer.bias.requires_grad)
    if _transposed(layer):
        layer.nf = len(index)
    else:
        layer.out_features = len(index)


def _keep_columns(layer: nn.Module, index: torch.Tensor) -> None:
    """Keep the inputs `index` of a linear."""
    layer.weight = nn.Parameter(layer.weight.data.index_select(0 if _transposed(layer) else 1, index).clone(),
                                requires_grad=layer.weight.requires_grad)
    if _transposed(layer):
        layer.nx = len(index)
        if not len(index):
            # Conv1D flattens its input with view(-1, width), which a zero-width input cannot take.
            layer.forward = types.MethodType(_bias_only, layer)
    else:
        layer.in_features = len(index)


def _bias_only(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A linear with no inputs left: its output is its bias."""
    return layer.bias.expand(*x.shape[:-1], layer.bias.shape[0])


def _head_rows(positions: list[int], head_dim: int, device: torch.device) -> torch.Tensor:
    return torch.tensor([pos * head_dim + i for pos in positions for i in range(head_dim)], dtype=torch.long,
                        device=device)


def _update_cache_with_no_heads(module: nn.Module, hidden_states: torch.Tensor, kwargs: dict) -> None:
    """Keep a generation cache's bookkeeping (sequence length, cross-attention reuse) right.

    The decoder reads the cache's length to place new tokens, so an emptied layer still appends
    placeholder keys and values of the right sequence length. They hold one width-1 "head", because
    transformers reports the length of an empty (zero-element) cache layer as 0.
    """
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    if cache is None:
        return
    key_value_states = kwargs.get("key_value_states")
    is_cross = key_value_states is not None
    layer_cache = cache
    if hasattr(cache, "self_attention_cache"):  # EncoderDecoderCache
        if is_cross and cache.is_updated.get(module.layer_idx):
            return
        layer_cache = cache.cross_attention_cache if is_cross else cache.self_attention_cache
    source = key_value_states if is_cross else hidden_states
    placeholder = source.new_zeros(source.shape[0], 1, source.shape[1], 1)
    layer_cache.update(placeholder, placeholder, module.layer_idx)
    if is_cross and hasattr(cache, "is_updated"):
        cache.is_updated[module.layer_idx] = True


def _install_empty_forward(site: AttentionSite) -> None:
    layout, out_proj = site.layout, site.out_proj

    def forward(module: nn.Module, *args, **kwargs):
        hidden_states = args[0] if args else kwargs[layout.query_arg]
        _update_cache_with_no_heads(module, hidden_states, kwargs)
        output = hidden_states.new_zeros(*hidden_states.shape[:-1], 0)
        if layout.projects_output:
            output = out_proj(output)
        return (output,) if layout.returns_singleton else (output, None)

    site.module.forward = types.MethodType(forward, site.module)


def _install_head_bias_selection(site: AttentionSite) -> None:
    position = site.layout.head_bias_arg
    module = site.module

    def select_kept(_module: nn.Module, args: tuple) -> tuple | None:
        if len(args) <= position or args[position] is None:
            return None
        kept = torch.tensor(module.kept_heads, dtype=torch.long, device=args[position].device)
        return (*args[:position], args[position].index_select(1, kept), *args[position + 1 :])

    module.register_forward_pre_hook(select_kept)


def _present_units(present: list[int], unit: str) -> str:
    # Heads are few enough to list; a layer's thousands of neurons are only counted.
    return f"{unit}s still present: {present}" if len(present) <= 16 else f"{len(present)} {unit}s still present"


def _validate_plan(units: Mapping[int, Iterable[int]], names: list[str], present: list[list[int]],
                   original: list[int], sites_word: str, unit: str) -> dict[int, list[int]]:
    plan: dict[int, list[int]] = {}
    for site_index, site_units in units.items():
        if not isinstance(site_index, int) or not 0 <= site_index < len(names):
            raise IndexError(f"site index {site_index!r} out of range: the model has {len(names)} {sites_word} "
                             f"(0..{len(names) - 1})")
        kept = set(present[site_index])
        wanted = sorted(set(int(u) for u in site_units))
        for u in wanted:
            if not 0 <= u < original[site_index]:
                raise IndexError(f"site {site_index} ({names[site_index]}): {unit} {u} out of range; "
                                 f"valid {unit}s are 0..{original[site_index] - 1}")
            if u not in kept:
                raise ValueError(f"site {site_index} ({names[site_index]}): {unit} {u} was already pruned; "
                                 f"{_present_units(present[site_index], unit)}")
        plan[site_index] = wanted
    return plan


def kept_group_sizes(site: AttentionSite, removed: Iterable[int]) -> list[int]:
    """How many query heads each key/value head of `site` would serve once the original heads `removed` go
    (groups left empty are not listed: their key/value head goes too)."""
    gone, size, sizes = set(removed), site.original_group_size, {}
    for head in site.kept_heads:
        if head not in gone:
            sizes[head // size] = sizes.get(head // size, 0) + 1
    return [sizes[kv] for kv in sorted(sizes)]


def validate_heads_to_prune(sites: list[AttentionSite], heads: Mapping[int, Iterable[int]]) -> dict[int, list[int]]:
    """Check a `{site_index: [original head index, ...]}` plan against the model; return it normalised.

    Under grouped-query attention every key/value head must keep the same number of query heads (or none)."""
    plan = _validate_plan(heads, [s.name for s in sites], [s.kept_heads for s in sites],
                          [s.original_num_heads for s in sites],
                          "attention sites", "head")
    for site_index, removed in plan.items():
        site = sites[site_index]
        sizes = kept_group_sizes(site, removed)
        if len(set(sizes)) > 1:
            raise ValueError(f"site {site_index} ({site.name}): grouped-query attention needs every key/value head "
                             f"to keep the same number of query heads, but this plan leaves groups of {sizes}; "
                             f"remove the same number from each group (unit: query) or whole groups (unit: group)")
    return plan


def validate_neurons_to_prune(sites: list[FeedForwardSite], neurons: Mapping[int, Iterable[int]]
                              ) -> dict[int, list[int]]:
    """Check a `{ffn_site_index: [original neuron index, ...]}` plan against the model; return it normalised."""
    return _validate_plan(neurons, [s.name for s in sites], [s.kept_neurons for s in sites],
                          [s.original_num_neurons for s in sites], "FFN sites", "neuron")


def prune_heads(model: nn.Module, heads: Mapping[int, Iterable[int]]) -> nn.Module:
    """Remove heads for real. `heads` maps a site index (see `attention_sites`) to the original
    indices of the heads to remove (original, so plans stay valid across successive prunings).

    The whole plan is checked before anything changes, so a bad plan leaves the model as it was.
    Returns the model, modified in place.
    """
    sites = attention_sites(model)
    plan = validate_heads_to_prune(sites, heads)
    for site_index, removed in plan.items():
        if not removed:
            continue
        site = sites[site_index]
        layout, module = site.layout, site.module
        present, present_kv, width = site.kept_heads, site.kept_kv_heads, site.num_heads * site.head_dim
        if not hasattr(module, "original_num_heads"):
            module.original_num_heads = site.num_heads
            module.original_group_size = site.original_group_size
            if layout.head_bias_arg is not None:
                _install_head_bias_selection(site)
        keep = [pos for pos, head in enumerate(present) if head not in removed]
        kept = [present[pos] for pos in keep]
        d = site.head_dim
        device = site.out_proj.weight.device
        rows = _head_rows(keep, d, device)
        query, key, value = site.projections
        if layout.fused_qkv:  # [query | key | value], each `width` wide
            _keep_rows(query, torch.cat([rows, rows + width, rows + 2 * width]))
        elif layout.group_size_attr is None:
            for projection in (query, key, value):
                _keep_rows(projection, rows)
        else:
            kept_kv = {head // module.original_group_size for head in kept}
            kv_rows = _head_rows([pos for pos, kv in enumerate(present_kv) if kv in kept_kv], d, device)
            _keep_rows(query, rows)
            _keep_rows(key, kv_rows)
            _keep_rows(value, kv_rows)
            if kept:
                setattr(module, layout.group_size_attr, len(kept) // len(kept_kv))
        _keep_columns(site.out_proj, rows)
        if layout.num_heads_attr is not None:
            setattr(module, layout.num_heads_attr, len(keep))
        if layout.inner_dim_attr:
            setattr(module, layout.inner_dim_attr, len(keep) * d)
        module.kept_heads = kept
        if not keep:
            _install_empty_forward(site)
    return model


def prune_neurons(model: nn.Module, neurons: Mapping[int, Iterable[int]]) -> nn.Module:
    """Remove FFN neurons for real. `neurons` maps an FFN site index (see `ffn_sites`) to the original
    indices of the neurons to remove (original, so plans stay valid across successive prunings).

    The whole plan is checked before anything changes, so a bad plan leaves the model as it was.
    Removing every neuron of a block leaves it adding only its second linear's bias.
    Returns the model, modified in place.
    """
    sites = ffn_sites(model)
    plan = validate_neurons_to_prune(sites, neurons)
    for site_index, removed in plan.items():
        if not removed:
            continue
        site = sites[site_index]
        present, gone = site.kept_neurons, set(removed)
        site.fc_in.original_num_neurons = site.original_num_neurons
        keep = [pos for pos, neuron in enumerate(present) if neuron not in gone]
        index = torch.tensor(keep, dtype=torch.long, device=site.fc_in.weight.device)
        for fc in site.inputs:
            _keep_rows(fc, index)
        _keep_columns(site.fc_out, index)
        site.fc_in.kept_neurons = [present[pos] for pos in keep]
    return model
