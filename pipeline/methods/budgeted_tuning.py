"""Step 3 of budgeted pruning (pipeline/methods/budgeted.py): tune a pruned model with no retraining (`tune`).

Layer by layer, the kept heads and neurons are rescaled so that the pruned layer reproduces the unpruned layer's
output, residual included, on a sample: a linear least-squares problem per sublayer (`_solve_scales`, damped
towards scales of 1). The scales are folded into the output projections, so the result is an ordinary physically
pruned model that `pipeline.core.checkpoint.save_model` writes like every other.
"""

from __future__ import annotations

import torch
from torch import nn
from tqdm.auto import tqdm

from pipeline.core.gates import head_gates, neuron_gates
from pipeline.core.sites import attention_sites, family_of, ffn_sites, is_decoder_only, pre_norms
from pipeline.files.schema import ENCODER
from pipeline.methods.budgeted_search import Batches


class _Stop(Exception):
    """Raised from a hook to end a forward pass once the layer being tuned has run."""


def _tokens(x: torch.Tensor, mask: torch.Tensor, first_only: bool) -> torch.Tensor:
    """`[batch, seq, d]` -> the `[tokens, d]` rows of real (unpadded) tokens, or of each first token. OPT runs its
    FFN on the flattened `[batch * seq, d]`."""
    x = x.view(*mask.shape, x.shape[-1]) if x.dim() == 2 else x
    return x[:, 0] if first_only else x[mask.bool()]


def _query_input(layout, args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs[layout.query_arg]


def _solve_scales(ata: torch.Tensor, atb: torch.Tensor, damping: float) -> torch.Tensor | None:
    """argmin_m ||A m - b||^2 + lambda ||m - 1||^2 from the normal equations, or None when the system is
    degenerate or the scales come out wild (|m| > 10, as Kwon's code bounds them): then the units keep 1."""
    ata, atb = ata.cpu(), atb.cpu()  # a small fp64 system: solved on the CPU, the same on every device
    ones = torch.ones_like(atb)
    lam = damping * ata.diagonal().mean().clamp(min=1e-12)
    delta = torch.linalg.solve(ata + lam * torch.eye(len(atb), dtype=ata.dtype), atb - ata @ ones)
    scales = ones + delta
    if not torch.isfinite(scales).all() or scales.abs().max() > 10:
        return None
    return scales


@torch.no_grad()
def tune(student: nn.Module, teacher: nn.Module, batches: Batches, first_token_last_layer: bool = False,
         damping: float = 1e-3, progress: bool = True) -> dict[str, int]:
    """Rescale the kept heads and neurons of `student` (a physically pruned copy of `teacher`) in place, layer
    by layer, so that each sublayer's output plus its residual input matches the teacher's on `batches`.

    Sublayers are tuned in model order, each on the inputs the already-tuned student gives it, so later
    layers also correct earlier layers' errors. `first_token_last_layer`: a sequence classifier reads only the
    first token of the last layer, so only that token is matched there. Encoder-only post-norm models (every
    supported classification family: the residual is the sublayer's input) and decoder-only language models
    (pre-norm: the residual is the input of the norm in front of the sublayer). Gemma 3 also normalises each
    sublayer's output before the residual adds it, so its layers' outputs are not linear in the scales: there each
    sublayer's output before that norm is matched to the teacher's, residual left out (matched exactly, the norm
    gives the teacher's contribution); the fit on the student's own inputs still corrects earlier layers' errors
    in part. Returns how many sublayers were tuned and how many kept their scales at 1.
    """
    s_sites, t_sites = attention_sites(student), attention_sites(teacher)
    s_ffn, t_ffn = ffn_sites(student), ffn_sites(teacher)
    one_stack = all(site.kind == ENCODER for site in s_sites) or is_decoder_only(student)
    if not one_stack or len(s_sites) != len(s_ffn):
        raise ValueError("tuning supports encoder-only and decoder-only models (one attention and one FFN "
                         f"sublayer per layer); {type(student).__name__} has {len(s_sites)} attention and "
                         f"{len(s_ffn)} FFN sites")
    s_norms, t_norms = pre_norms(student), pre_norms(teacher)
    # Adding the residual to the target where the output is normalised first would ask the output projection for the
    # residual stream's difference, in units the norm then rescales: scales far from 1 even for an unpruned copy.
    adds_residual = not family_of(student).normed_outputs
    device = next(student.parameters()).device
    batches = [{k: v.to(device) for k, v in batch.items()} for batch in batches]
    masks = [batch["attention_mask"] for batch in batches]
    inputs = [{k: v for k, v in batch.items() if k != "labels"} for batch in batches]
    last = len(s_sites) - 1
    # Each sublayer is (kind, site index): its residual input comes from `entry`, its output from `exit`.
    sublayers = [(kind, i) for i in range(len(s_sites)) for kind in ("attention", "ffn")]

    def entry_exit(sites_, ffn_, norms, kind: str, i: int) -> tuple[nn.Module, nn.Module]:
        """Where the sublayer's residual is read (its input, or its pre-norm's) and the module it ends with."""
        attention = kind == "attention"
        exit_ = sites_[i].out_proj if attention else ffn_[i].fc_out
        if norms is not None:
            return norms[i][0 if attention else 1], exit_
        return (sites_[i].module if attention else ffn_[i].fc_in), exit_

    def residual_of(layout, kind: str, pre_norm: bool, args: tuple, kwargs: dict) -> torch.Tensor:
        return _query_input(layout, args, kwargs) if kind == "attention" and not pre_norm else args[0]

    # The teacher's target for every sublayer, in one pass: output (bias included) + residual input.
    targets: dict[tuple[str, int], list[torch.Tensor]] = {key: [] for key in sublayers}
    handles, current = [], {}
    for kind, i in sublayers:
        first_only = first_token_last_layer and kind == "ffn" and i == last
        entry, exit_ = entry_exit(t_sites, t_ffn, t_norms, kind, i)
        layout = t_sites[i].layout

        def grab_residual(_m, args, kwargs, key=(kind, i), layout=layout):
            current[key] = residual_of(layout, key[0], t_norms is not None, args, kwargs)

        def grab_target(_m, _args, output, key=(kind, i), first_only=first_only):
            target = output + current.pop(key) if adds_residual else output
            targets[key].append(_tokens(target, current["mask"], first_only).double())

        if adds_residual:
            handles.append(entry.register_forward_pre_hook(grab_residual, with_kwargs=True))
        handles.append(exit_.register_forward_hook(grab_target))
    try:
        for mask, batch in zip(masks, inputs, strict=True):
            current["mask"] = mask
            teacher(**batch)
    finally:
        for handle in handles:
            handle.remove()

    outcome = {"tuned": 0, "kept_at_one": 0}
    captured: dict[str, torch.Tensor] = {}  # the student's tensors of the sublayer being tuned, batch by batch
    with head_gates(student) as h_gates, neuron_gates(student) as n_gates:
        for kind, i in tqdm(sublayers, desc="tune", disable=not progress, leave=False):
            units = s_sites[i].num_heads if kind == "attention" else s_ffn[i].num_neurons
            if units == 0:
                continue
            first_only = first_token_last_layer and kind == "ffn" and i == last
            entry, exit_ = entry_exit(s_sites, s_ffn, s_norms, kind, i)
            weight = _weight_out_in(exit_).double()  # [hidden, units * width]
            bias = exit_.bias.double() if exit_.bias is not None else 0.0
            ata = torch.zeros(units, units, dtype=torch.float64, device=weight.device)
            atb = torch.zeros(units, dtype=torch.float64, device=weight.device)

            def grab_residual(_m, args, kwargs, layout=s_sites[i].layout, kind=kind):
                captured["residual"] = residual_of(layout, kind, s_norms is not None, args, kwargs)

            def grab_parts(_m, args):
                captured["parts"] = args[0]
                raise _Stop

            handles = [exit_.register_forward_pre_hook(grab_parts)]
            if adds_residual:
                handles.append(entry.register_forward_pre_hook(grab_residual, with_kwargs=True))
            try:
                for mask, batch, target in zip(masks, inputs, targets[(kind, i)], strict=True):
                    try:
                        student(**batch)
                    except _Stop:
                        pass
                    parts = _tokens(captured["parts"], mask, first_only).double()
                    residual = _tokens(captured["residual"], mask, first_only).double() if adds_residual else 0.0
                    b = target - bias - residual  # what the units' weighted sum must produce
                    if kind == "attention":
                        # Each head's own contribution to the output: its slice of the context times its columns.
                        width = parts.shape[1] // units
                        per_unit = torch.einsum("tuw,duw->tud", parts.view(-1, units, width),
                                                weight.view(-1, units, width))
                        ata += torch.einsum("tud,tvd->uv", per_unit, per_unit)
                        atb += torch.einsum("tud,td->u", per_unit, b)
                    else:
                        # Neuron u contributes parts[:, u] * weight[:, u]: the Gram matrix factorises.
                        ata += (parts.T @ parts) * (weight.T @ weight)
                        atb += (parts * (b @ weight)).sum(dim=0)
            finally:
                for handle in handles:
                    handle.remove()
            scales = _solve_scales(ata, atb, damping)
            if scales is None:
                outcome["kept_at_one"] += 1
                continue
            gates = h_gates if kind == "attention" else n_gates
            gates[i] = scales.to(device=gates[i].device, dtype=gates[i].dtype)
            outcome["tuned"] += 1
        # Fold the scales into the output projections' columns, so no gate is needed at inference.
        for gate, site in zip(h_gates, s_sites, strict=True):
            if site.num_heads:
                _weight_out_in(site.out_proj).mul_(gate.repeat_interleave(site.head_dim).to(site.out_proj.weight.dtype))
        for gate, site in zip(n_gates, s_ffn, strict=True):
            if site.num_neurons:
                _weight_out_in(site.fc_out).mul_(gate.to(site.fc_out.weight.dtype))
    return outcome


def _weight_out_in(layer: nn.Module) -> torch.Tensor:
    """A linear's weight as `[out, in]`: GPT-2's Conv1D stores it transposed (a view, so writes go through)."""
    return layer.weight if isinstance(layer, nn.Linear) else layer.weight.T
