"""Which shares of a model's heads a saved pruned model can lose: the levels its attention shape takes.

Heads go in whole units (pipeline/core/importance.py: under grouped-query attention one query head from every
key/value group, or a whole group), and `prune.uniform` takes as many from every layer. So a requested fraction may
be far from any plan: 9 query heads in 3 groups lose 0, 3, 6 or 9 heads a layer alike, and 25% of them used to
become none at all, a pruned/25 folder holding the unpruned model. A saved folder is named by its fraction
(`pruned_name`) and the recover and benchmark stages find it, and label their rows, by that fraction; so a saved
level must be one the shape takes, to the whole percent its name shows, and it must remove heads and leave some.
A level that is not is refused in one line that lists the levels that are, rather than rounded: a rounded level
would name a folder after a fraction nobody asked for, and two requests could round to one folder.

Pure Python, so that `python -m pipeline.checks` refuses such a level as soon as it knows the shape (a scratch
model's params, a local folder's config.json, a GGUF header, the pinned defaults) and the prune stage, which always
knows it, before it writes anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import lcm

from pipeline.files.schema import pruned_name


class LevelError(ValueError):
    """A level to save that the model's shape cannot take: one line naming the param and the levels it can."""


@dataclass(frozen=True)
class AttentionShape:
    """Query heads and key/value heads of each attention site (a layer's self-attention, or a cross-attention)."""

    heads: tuple[int, ...]
    kv_heads: tuple[int, ...]  # equal to heads for multi-head attention

    @classmethod
    def alike(cls, sites: int, heads: int, kv_heads: int | None = None) -> AttentionShape:
        """`sites` sites of `heads` query heads sharing `kv_heads` key/value heads (default: multi-head)."""
        return cls((heads,) * sites, (kv_heads or heads,) * sites)

    @property
    def total(self) -> int:
        return sum(self.heads)

    def unit_sizes(self, unit: str) -> list[int]:
        """The heads of one unit at each site: one head under multi-head attention; under grouped-query attention
        one query head from each group (unit "query") or a whole group (unit "group")."""
        return [1 if heads == kv else kv if unit == "query" else heads // kv
                for heads, kv in zip(self.heads, self.kv_heads, strict=True)]

    def describe(self, unit: str) -> str:
        """'30 attention layers of 9 query heads in 3 key/value groups, taken in whole units of 3 (one from each
        group)', for the lines that refuse a level."""
        sites, heads, kv = len(self.heads), self.heads[0], self.kv_heads[0]
        if set(self.heads) != {heads} or set(self.kv_heads) != {kv}:
            return f"{sites} attention layers of {min(self.heads)} to {max(self.heads)} heads"
        if heads == kv:
            return f"{sites} attention layers of {heads} heads, taken one at a time"
        size = self.unit_sizes(unit)[0]
        how = f"whole units of {size} (one from each group)" if unit == "query" else f"whole groups of {size}"
        return f"{sites} attention layers of {heads} query heads in {kv} key/value groups, taken in {how}"


def uniform_levels(shape: AttentionShape, unit: str, min_heads: int = 0) -> list[int]:
    """The heads a uniform plan can remove from every site: whole units of every site, some heads left in each (a
    layer of no heads has no stock config), and `min_heads` at least."""
    step = lcm(*shape.unit_sizes(unit))
    most = min(min(shape.heads) - 1, min(shape.heads) - min_heads)
    return list(range(step, most + 1, step))


def heads_to_save(fraction: float, shape: AttentionShape, unit: str, uniform: bool, min_heads: int = 0,
                  key: str = "prune.save_fractions") -> int:
    """How many heads the saved model at `fraction` loses in all. Uniform: a level the shape takes whose folder
    name is `fraction`'s (0.33 for a third); else `fraction` of the heads, at least one unit. Raises LevelError
    naming `key` and the levels the shape takes."""
    sites, total = len(shape.heads), shape.total
    if uniform:
        levels = uniform_levels(shape, unit, min_heads)
        for per_site in levels:
            if pruned_name(per_site * sites / total) == pruned_name(fraction):
                return per_site * sites
        allowed = ", ".join(f"{per_site * sites / total:.3g}" for per_site in levels) or "none"
        raise LevelError(f"{key}: {fraction:g} of the heads cannot go alike from {shape.describe(unit)}"
                         f"{f', keeping {min_heads} a layer' if min_heads else ''}; the levels it can save are "
                         f"{allowed}")
    smallest = min(shape.unit_sizes(unit))
    count = round(fraction * total)
    if count < smallest:
        raise LevelError(f"{key}: {fraction:g} of {total} heads is {count}, less than one unit of {smallest}, so the "
                         f"saved model would be the unpruned one; the smallest level is {smallest / total:.3g}")
    return count
