"""The width-pruning methods, by name: each a criterion, an allocation and its own published compensation.

Adding a method is one entry in `WIDTH_METHODS`. The peers follow their papers and code (each criterion's docstring
in pipeline/methods/width/criteria.py names the file); where a peer's code assumes multi-head attention, its
attention unit here is the experiment's (`prune.unit`: a slice of query heads, or a whole key/value group), scored
as the sum (FLAP: the mean) of its heads' scores, so that every method prunes a valid grouped-query shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from pipeline.files.schema import PAPER_IMPORTANCE, WIDTH_OURS, WIDTH_OWN_COMPENSATION, WIDTH_SKIPPED_LAYERS
from pipeline.methods.width import criteria
from pipeline.methods.width.allocation import KWON, THRESHOLD, UNIFORM
from pipeline.methods.width.compensation import NONE
from pipeline.methods.width.criteria import UnitScores
from pipeline.methods.width.statistics import CalibrationStatistics


@dataclass(frozen=True)
class WidthMethod:
    criterion: Callable[[nn.Module, CalibrationStatistics], UnitScores]
    allocation: str
    what: str  # one line for the report

    def layers(self, num_layers: int, name: str) -> range:
        """The layers the method prunes: all, but LLM-Pruner's middle blocks only (`WIDTH_SKIPPED_LAYERS`)."""
        bottom, top = WIDTH_SKIPPED_LAYERS.get(name, (0.0, 0.0))
        return range(round(bottom * num_layers), num_layers - round(top * num_layers))


def own_compensation(name: str) -> str:
    """What the method's paper and code do after pruning, with no retraining (`WIDTH_OWN_COMPENSATION`)."""
    return WIDTH_OWN_COMPENSATION.get(name, NONE)


WIDTH_METHODS: dict[str, WidthMethod] = {
    "llm-pruner": WidthMethod(criteria.llm_pruner, UNIFORM,
                              "LLM-Pruner: first-order Taylor of coupled weights, uniform in its middle layers"),
    "flap": WidthMethod(criteria.flap, THRESHOLD,
                        "FLAP: fluctuation x weight norm, standardised per layer, one global threshold, bias"),
    "wanda-sp": WidthMethod(criteria.wanda_sp, UNIFORM, "Wanda-sp: |W| x ||X|| per channel, uniform"),
    "minitron": WidthMethod(criteria.minitron, UNIFORM, "Minitron: activation magnitudes, one target width"),
    "magnitude": WidthMethod(criteria.magnitude, UNIFORM, "Torch-Pruning: group weight magnitude (L2), uniform"),
    PAPER_IMPORTANCE: WidthMethod(criteria.paper_importance, KWON,
                                  "the paper's |dL/dxi| on heads and MLP channels, Kwon's global search"),
    # Ours: what won on SmolLM2 (docs/width-pruning.md). FLAP's standardised scores spread the budget over the
    # layers and between attention and MLP better than the other criteria; where FLAP's bias makes up the removed
    # channels' mean, the refit makes up their whole contribution, as far as the kept channels span it.
    WIDTH_OURS: WidthMethod(criteria.flap, THRESHOLD,
                            "ours: FLAP's selection, then the least-squares refit of every output projection"),
}
