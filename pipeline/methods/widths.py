"""Hardware-aware widths for budgeted pruning: the multiple of FFN neurons this machine's matrix kernels run well.

A budget counts FLOPs, which fall in proportion to the neurons kept, but a matrix product's time does not: the
kernels work in tiles and vector registers, so an FFN cut to a width that is not a multiple of their size runs
slower per neuron than one cut to a width that is. Measured here (2 AMD EPYC cores, torch 2.13, 2,048 tokens of a
384-wide MiniLM FFN), widths of 250, 500 and 1,000 neurons took 1.6-2.5x their share of the full FFN's time,
while 256, 512 and 1,024 took 0.96-1.03x.

`probe_width_multiple` times FFNs of many widths on this device, each rounded up to every candidate multiple, and
picks the smallest multiple that runs as well as the best; `pipeline.methods.budgeted_search.search` then keeps each
layer's neurons in blocks of that many. Heads need no rounding: a head is `head_dim` columns (32 or 64 in every
supported family), already a whole tile.

`python -m pipeline.studies.widths --device cuda --precision bf16` runs the probe on its own and prints the
integer to pin as `prune.budgeted.width_multiple`, so that the pruned widths do not depend on one run's timings.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from pipeline.core.timer import median_times

CANDIDATES = (1, 4, 8, 16, 32, 64)
# A multiple is chosen when its efficiency is within this of the best candidate's: a larger multiple costs accuracy
# (the budget is spent in coarser blocks), so it must buy a measurable speed.
TOLERANCE = 0.03


@dataclass(frozen=True)
class WidthProbe:
    """The chosen multiple, and each candidate's efficiency: the median over the sampled widths of the time the
    width's share of the full FFN would take (its FLOPs) over the time it took; 1 is as fast as its FLOPs say."""

    multiple: int
    efficiency: dict[int, float]


def _rounded_up(width: int, multiple: int, full: int) -> int:
    return min(full, -(-width // multiple) * multiple)


def probe_width_multiple(hidden: int, full: int, token_counts: Sequence[int], device: torch.device | str = "cpu",
                         dtype: torch.dtype = torch.float32, widths: int = 12, rounds: int = 5,
                         candidates: Sequence[int] = CANDIDATES, seed: int = 0) -> WidthProbe:
    """Time an FFN (`hidden` -> width -> `hidden`) at `widths` seeded widths between an eighth of `full` and
    `full`, each rounded up to every candidate multiple, on `token_counts` tokens each, all widths taking turns
    for `rounds` rounds (`median_times`). A candidate's efficiency is the median over the widths, averaged over
    the token counts; the smallest candidate within `TOLERANCE` of the best wins."""
    generator = torch.Generator().manual_seed(seed)
    base = torch.randint(max(1, full // 8), full + 1, (widths,), generator=generator).tolist()
    shapes = sorted({full} | {_rounded_up(w, m, full) for w in base for m in candidates})
    torch.manual_seed(seed)
    ffns = {w: nn.Sequential(nn.Linear(hidden, w), nn.GELU(), nn.Linear(w, hidden)).to(device, dtype).eval()
            for w in shapes}
    per_tokens: list[dict[int, float]] = []
    for tokens in token_counts:
        x = torch.randn(tokens, hidden, generator=generator).to(device, dtype)
        with torch.inference_mode():
            seconds = median_times({w: (lambda f=f, x=x: f(x)) for w, f in ffns.items()}, rounds)
        speed = {w: seconds[full] * w / full / seconds[w] for w in shapes}
        per_tokens.append({m: statistics.median([speed[_rounded_up(w, m, full)] for w in base]) for m in candidates})
    efficiency = {m: round(statistics.fmean(e[m] for e in per_tokens), 4) for m in candidates}
    return WidthProbe(smallest_near_best(efficiency), efficiency)


def smallest_near_best(efficiency: dict[int, float], tolerance: float = TOLERANCE) -> int:
    """The smallest multiple whose efficiency is within `tolerance` of the best one's."""
    best = max(efficiency.values())
    return min(m for m, e in efficiency.items() if e >= best - tolerance)
