"""The names that more than one layer writes or reads: one home each.

The stages write these files and columns, the report and the flows read them, and the params validation
checks the names the user may choose. Pure Python (no torch), so `config` and `flows` import it cheaply.
"""

from __future__ import annotations

# --- where a model and data come from (params) ----------------------------------------------------
DEFAULT = "default"  # the offline default model / data (pinned PyPI wheels)
SCRATCH = "scratch"  # translation: a Marian model trained from scratch by the finetune stage

# --- splits, attention kinds, metrics ---------------------------------------------------------------
SPLITS = ("train", "dev", "test")
EVAL_SPLITS = ("dev", "test")  # what the curves and the fine-tuning metric are measured on
# Attention kinds: each stack's self-attention, and the decoder's attention to the encoder (cross);
# encoder-only models have ENCODER alone.
ENCODER, DECODER, CROSS = "encoder", "decoder", "cross"
KINDS = (ENCODER, DECODER, CROSS)
KIND_LABELS = {ENCODER: "encoder self-attention", DECODER: "decoder self-attention", CROSS: "cross-attention"}
CLASSIFICATION_METRICS = ("accuracy", "matthews", "f1")
# What goes together under grouped-query attention (`prune.unit`): the same number of query heads from every
# key/value group of a layer, or whole groups with their key/value head (pipeline/core/importance.py).
HEAD_UNITS = ("query", "group")
# --- where models run (the `runtime` params; pipeline/core/runtime.py maps them to torch) -------------
PRECISIONS = ("fp32", "bf16", "fp16")
DEVICES = "auto, cpu, cuda or cuda:N"  # auto: the GPU when there is one
DEVICE_PATTERN = r"auto|cpu|cuda(:[0-9]+)?"
BLEU = "bleu"

# --- the claims' thresholds (prune.json, the report) ---------------------------------------------------
TOLERANCE = 1.0  # points (or BLEU) lost that still count as "no real loss": the prunable fraction
ALPHA = 0.05  # significance level of the single-head ablation

# --- pruning methods (the `method` column of pruning_curve.csv and budgeted_curve.csv) ----------------
IMPORTANCE = "importance"  # one-shot importance order (Figure 3)
REESTIMATED = "reestimated"  # importance re-estimated after each step (Figure 4)
RANDOM = "random"  # mean of random orders over seeds
# Other tools' head criteria, ranked and chosen as the importance order is (`prune.criteria`):
MAGNITUDE = "magnitude"  # Torch-Pruning's weight magnitude
ACTIVATION = "activation"  # Minitron's mean head-activation norm
HEAD_CRITERIA = (MAGNITUDE, ACTIVATION)
PAPER = "paper"  # budgeted comparison: the paper's order, heads removed until the model fits the budget
BUDGETED_HEADS, BUDGETED, BUDGETED_TUNED = "budgeted-heads", "budgeted", "budgeted-tuned"
BUDGETED_METHODS = (BUDGETED_HEADS, BUDGETED, BUDGETED_TUNED)


def kind_method(kind: str) -> str:
    """The curve of one attention kind pruned alone (Figure 5)."""
    return f"{IMPORTANCE}-{kind}"


def checkpoint_method(step: int) -> str:
    """The curve of a training checkpoint pruned by its own importance (Figure 6)."""
    return f"checkpoint-{step}"


# --- an experiment's folders (artifacts/<experiment>/) --------------------------------------------
BASE_MODEL_DIR, DATA_DIR, FINETUNED_DIR = "base_model", "data", "finetuned"
PRUNED_DIR, CHECKPOINTS_DIR = "pruned", "checkpoints"
TASK_FILE = "task.json"  # in the data folder: labels, metric, languages
PRUNING_FILE = "head_pruning.json"  # in a pruned model folder: the heads and neurons removed
FAIRSEQ_CHECKPOINT = "checkpoint.pt"  # the model file of a fairseq model folder, beside its dict.<lang>.txt


def pruned_name(fraction: float) -> str:
    """The folder of the model with `fraction` of its heads pruned: 0.3 -> "30"."""
    return f"{round(100 * fraction):02d}"


def kv_groups_name(fraction: float) -> str:
    """The folder of the serving-shape model, `fraction` of every layer's KV groups removed: 0.5 -> "kv-groups-50"."""
    return f"kv-groups-{round(100 * fraction):02d}"


def budgeted_name(level: float) -> str:
    """The folder of the budgeted-tuned model with `level` of its cost removed: 0.4 -> "budgeted-40"."""
    return f"{BUDGETED_TUNED.removesuffix('-tuned')}-{round(100 * level):02d}"


def checkpoint_name(step: int) -> str:
    """The folder of the training checkpoint after `step` optimisation steps."""
    return f"step-{step:06d}"


def checkpoint_step(name: str) -> int | None:
    """The step of a checkpoint folder's name, or None when the name is not one."""
    prefix = "step-"
    return int(name.removeprefix(prefix)) if name.startswith(prefix) and name[len(prefix):].isdigit() else None


# --- the tables an experiment writes (reports/<experiment>/): the columns every reader relies on ------
TABLE_COLUMNS = {
    "importance.csv": ["kind", "layer", "head", "importance"],
    "ablation.csv": ["kind", "layer", "head", "metric", "delta", "p_value"],
    "one_head.csv": ["kind", "layer", "best_head", "metric", "delta"],
    "pruning_curve.csv": ["method", "split", "fraction_pruned", "metric"],
    "budgeted_curve.csv": ["method", "split", "budget_removed", "fraction_flops_removed", "heads_pruned",
                           "neurons_pruned", "metric", "examples", "seconds"],
    "recovery.csv": ["fraction_pruned", "metric_before", "metric_after"],
    # device: torch's name of the GPU, or "cpu"; precision: one of PRECISIONS (the benchmark's autocast).
    "benchmark.csv": ["fraction_pruned", "batch_size", "attn_implementation", "examples_per_s", "speedup",
                      "ideal_speedup", "device", "precision"],
    "benchmark_budgeted.csv": ["attn_implementation", "batch_size", "budget_removed", "examples_per_s", "speedup",
                               "ideal_speedup", "params", "device", "precision"],
    # phase: prefill or decode (pipeline/methods/llm_bench.py); ideals from FLOPs and from KV-cache bytes per token.
    "llm_benchmark.csv": ["model", "batch_size", "phase", "tokens_per_s", "speedup", "ideal_speedup_flops",
                          "ideal_speedup_kv", "kv_bytes_per_token", "peak_memory_mb", "params", "device", "precision"],
}
