"""The width stage's params against the model's shape, before anything loads (`python -m pipeline.checks`): a level
that a method cannot reach, and a compensation the model's family cannot run or save, each in one line.

- A level: every method removes the attention and MLP weights of the layers it prunes and nothing else (the norms
  stay, and LLM-Pruner leaves its first and last layers alone), so a share of the parameters or of the KV-cache
  bytes above what those layers hold is out of reach. A FLOPs budget's fixed part (the embeddings' and the head's
  FLOPs) needs a forward pass to count, so the stage itself refuses an unreachable one.
- A compensation: FLAP's bias lives in o_proj and down_proj, which any family's modules hold in memory, where the
  sweep evaluates every model, but only some configs can switch on (pipeline/methods/width/compensation.py,
  `BIAS_CONFIG_KEYS`); so a bias is refused only where the stage would save it, in the models of
  `width.save_levels` (ours, with its own compensation) into any other family. The refit needs an MLP block of its
  own to run (OPT's FFN linears sit in the decoder layer).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.files.schema import (
    BIAS_COMPENSATION,
    BIAS_CONFIG_KEYS,
    NO_MLP_BLOCK,
    REFIT_COMPENSATION,
    WIDTH_OURS,
    WIDTH_OWN_COMPENSATION,
    WIDTH_SKIPPED_LAYERS,
)

if TYPE_CHECKING:
    from pipeline.tasks.language_modeling.params import LanguageModelingParams


def _pruned_layers(method: str, layers: int) -> int:
    bottom, top = WIDTH_SKIPPED_LAYERS.get(method, (0.0, 0.0))
    return layers - round(bottom * layers) - round(top * layers)


def width_problems(params: LanguageModelingParams, config: dict, model_type: str | None) -> list[str]:
    """One line per unreachable level and per unsavable compensation of `params.width`, for a model of `config`."""
    w = params.width
    if not w.methods and not w.save_levels:
        return []
    problems = []
    own = {WIDTH_OWN_COMPENSATION.get(method) for method in w.methods}
    # The stage saves ours at width.save_levels with its own compensation (pipeline/tasks/language_modeling/width.py);
    # the sweep's other models, flap's with its bias among them, live in memory only.
    saved = WIDTH_OWN_COMPENSATION[WIDTH_OURS] if w.save_levels else None
    if saved == BIAS_COMPENSATION and model_type is not None and model_type not in BIAS_CONFIG_KEYS:
        problems.append(f"width.save_levels: the saved models ({WIDTH_OURS}) carry FLAP's bias in o_proj and "
                        f"down_proj, which {model_type} configs cannot say (only {', '.join(BIAS_CONFIG_KEYS)}), so "
                        f"their folders would load without it; set width.save_levels: []")
    uses_refit = REFIT_COMPENSATION in (*w.compensations, *own)
    if uses_refit and model_type in NO_MLP_BLOCK:
        problems.append(f"width: the refit (width.compensations, and ours) runs each MLP block on its own, which "
                        f"{model_type}'s decoder layers do not have; remove refit from width.compensations and ours "
                        f"from width.methods")
    if w.budget == "kv-bytes" and params.prune.unit == "query":
        problems.append("width.budget: kv-bytes removes key/value heads, which prune.unit: query keeps (a slice of "
                        "query heads leaves every group's key/value head); set prune.unit: group")
    try:
        hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        intermediate = int(config["intermediate_size"])
    except (KeyError, TypeError, ValueError):
        return problems  # the memory plan names a config it cannot read
    gated = 3 if model_type not in ("gpt2", "opt") else 2
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    per_layer = attention + gated * hidden * intermediate
    total = layers * (per_layer + 2 * hidden) + hidden
    if w.budget == "flops":
        return problems
    for method in w.methods:
        pruned = _pruned_layers(method, layers)
        reach = pruned / layers if w.budget == "kv-bytes" else pruned * per_layer / total
        too_far = [level for level in (*w.levels, *w.save_levels) if level >= reach]
        if too_far:
            problems.append(f"width.levels: {', '.join(f'{level:.0%}' for level in too_far)} of the {w.budget} is "
                            f"out of reach for {method}: the {pruned} of {layers} layers it prunes hold "
                            f"{reach:.1%}; take levels below that")
    return problems
