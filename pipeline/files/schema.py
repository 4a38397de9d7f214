"""The names that more than one layer writes or reads: one home each.

The stages write these files and columns, the report and the flows read them, and the params validation
checks the names the user may choose. Pure Python (no torch), so `config` and `flows` import it cheaply.
"""

from __future__ import annotations

# --- where a model and data come from (params) ----------------------------------------------------
DEFAULT = "default"  # the offline default model / data (pinned PyPI wheels)
TATOEBA = "tatoeba"  # language modelling: the English sentences of the Tatoeba pairs (the scratch Llama's data)
SCRATCH = "scratch"  # a model trained from scratch by the finetune stage (translation: Marian; LM: Llama)

# --- the tasks (`task:` of a params file) ----------------------------------------------------------
CLASSIFICATION, TRANSLATION, LANGUAGE_MODELING = "classification", "translation", "language-modeling"
# The pipeline file that runs each task's experiments (its params.yaml beside it).
TASK_PIPELINES = {CLASSIFICATION: "dvc.yaml", TRANSLATION: "mt/dvc.yaml", LANGUAGE_MODELING: "llm/dvc.yaml"}

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
# The score stage's estimators of I_h: "example" is the paper's E_x |dL(x)/dxi_h|; "token" the mean of |dL(x)/dxi_h|
# over every token position (a gate per position), so that a head's opposite-signed effects cannot cancel.
SCORE_ESTIMATORS = ("example", "token")
# How the `recover` stage fine-tunes a pruned language model: LoRA adapters merged back, or every weight, on the
# next-token loss; kd-: the same, on the KL divergence from the unpruned model's next-token distribution
# (pipeline/tasks/language_modeling/training.py, distillation.py).
RECOVERY_METHODS = ("lora", "full", "kd-lora", "kd-full")
# What the `recover` stage trains on: the experiment's own train split, or general English (the train split with its
# corpus's tokenisation undone, beside Tatoeba's everyday sentences: pipeline/tasks/language_modeling/recovery_data.py).
RECOVERY_CORPORA = ("train", "general")
# --- where models run (the `runtime` params; pipeline/core/runtime.py maps them to torch) -------------
PRECISIONS = ("fp32", "bf16", "fp16")
# runtime.precision and benchmark.precisions also take "auto": bf16 where the hardware computes it natively (a CUDA
# GPU that supports it; a CPU with AVX512-BF16 or AMX), fp32 elsewhere (pipeline/core/runtime.py, `auto_precision`).
AUTO_PRECISION = "auto"
PRECISION_SETTINGS = (AUTO_PRECISION, *PRECISIONS)
DEVICES = "auto, cpu, cuda or cuda:N"  # auto: the GPU when there is one
DEVICE_PATTERN = r"auto|cpu|cuda(:[0-9]+)?"
# How a model too large for one device runs (runtime.placement): "whole" on runtime.device; "sharded" across the
# node's GPUs (and CPU, then disk) by accelerate's device_map="auto" within runtime.max_memory; "layerwise" one
# decoder layer at a time on the device, the rest on the CPU, the calibration activations carried forward.
PLACEMENTS = ("whole", "sharded", "layerwise")
WHOLE, SHARDED, LAYERWISE = PLACEMENTS
# runtime.max_memory's keys, accelerate's: a GPU index, "cpu" or "disk"; its values a size such as "70GiB".
MEMORY_KEY_PATTERN = r"[0-9]+|cpu|disk"
MEMORY_SIZE_PATTERN = r"[0-9]+(\.[0-9]+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)"
BLEU = "bleu"
PERPLEXITY = "perplexity"

# --- the claims' thresholds (prune.json, the report) ---------------------------------------------------
TOLERANCE = 1.0  # points (or BLEU) lost that still count as "no real loss": the prunable fraction
ALPHA = 0.05  # significance level of the single-head ablation

# --- which way a metric is better: the one home of metric direction ------------------------------------
# Accuracy, MCC, F1 and BLEU are higher-is-better, in points, with an absolute tolerance (TOLERANCE). Perplexity is
# lower-is-better and has no natural "point": it scales with the vocabulary and the text, so its tolerance is
# relative. A 5% rise in perplexity is about 0.05 nats of per-token loss (log 1.05), the size of the gap between
# neighbouring model sizes in a scaling curve: small, but no longer "no real loss".
LOWER_IS_BETTER = frozenset({PERPLEXITY})
RELATIVE_TOLERANCE = {PERPLEXITY: 0.05}  # metric -> the share of the unpruned value that may be lost


def improvement(metric: str, value: float, base: float) -> float:
    """How much better `value` is than `base`, in the metric's units: positive = better, whichever the direction.
    The `delta` of the ablation tables is this, so "improving" is always delta > 0 and the worst is its minimum."""
    return base - value if metric in LOWER_IS_BETTER else value - base


def worst_acceptable(metric: str, base: float) -> float:
    """The worst value that still counts as within tolerance of `base` (the unpruned model's)."""
    loss = RELATIVE_TOLERANCE[metric] * abs(base) if metric in RELATIVE_TOLERANCE else TOLERANCE
    return base + loss if metric in LOWER_IS_BETTER else base - loss


def within_tolerance(metric: str, value: float, base: float) -> bool:
    """Whether `value` loses no more than the tolerance against `base` (1e-9: values read back from CSV)."""
    return improvement(metric, value, worst_acceptable(metric, base)) >= -1e-9


def loss_against(metric: str, value: float, base: float) -> float:
    """How much worse `value` is than `base`, in the units `prune.budgeted.collapse` is given in: points (BLEU
    points), or for a relative-tolerance metric (perplexity) percent of `base`. Positive = worse."""
    loss = -improvement(metric, value, base)
    return 100 * loss / abs(base) if metric in RELATIVE_TOLERANCE else loss


def tolerance_text(metric: str, point: str = "point") -> str:
    """The tolerance in words: '1 point', '1 BLEU point', '5% perplexity'."""
    if metric in RELATIVE_TOLERANCE:
        return f"{100 * RELATIVE_TOLERANCE[metric]:g}% {metric}"
    return f"{TOLERANCE:g} {point}"

# --- pruning methods (the `method` column of pruning_curve.csv and budgeted_curve.csv) ----------------
IMPORTANCE = "importance"  # one-shot importance order (Figure 3)
# Language models: the importance order again, each pruned model's output projections refitted by least squares
# (pipeline/methods/width/compensation.py) before it is evaluated; "importance" is the same heads zeroed.
IMPORTANCE_REFIT = "importance+refit"
REESTIMATED = "reestimated"  # importance re-estimated after each step (Figure 4)
RANDOM = "random"  # mean of random orders over seeds
# Other tools' head criteria, ranked and chosen as the importance order is (`prune.criteria`):
MAGNITUDE = "magnitude"  # Torch-Pruning's weight magnitude
ACTIVATION = "activation"  # Minitron's mean head-activation norm
PAPER_IMPORTANCE = "paper-importance"  # the paper's estimator and L2 normalisation, beside another score stage setting
HEAD_CRITERIA = (MAGNITUDE, ACTIVATION, PAPER_IMPORTANCE)
PAPER = "paper"  # budgeted comparison: the paper's order, heads removed until the model fits the budget
BUDGETED_HEADS, BUDGETED, BUDGETED_TUNED = "budgeted-heads", "budgeted", "budgeted-tuned"
BUDGETED_METHODS = (BUDGETED_HEADS, BUDGETED, BUDGETED_TUNED)

# Width pruning of decoder LLMs (the width stage): query heads, key/value groups and MLP channels under one budget.
# The methods (pipeline/methods/width/methods.py): the peers, the paper's importance, and the project's own.
WIDTH_OURS = "ours"
WIDTH_METHODS = ("llm-pruner", "flap", "wanda-sp", "minitron", "magnitude", PAPER_IMPORTANCE, WIDTH_OURS)
# Retraining-free compensation after pruning (pipeline/methods/width/compensation.py).
NO_COMPENSATION, BIAS_COMPENSATION, REFIT_COMPENSATION = "none", "bias", "refit"
COMPENSATIONS = (NO_COMPENSATION, BIAS_COMPENSATION, REFIT_COMPENSATION)
# Pure data of the width methods that the checks read before torch loads (pipeline/checks/width_plan.py): each
# method's own compensation, and the shares of the layers it leaves alone at the bottom and the top (LLM-Pruner's
# Llama-7B command prunes layers 4-30 of 32).
WIDTH_OWN_COMPENSATION = {"flap": BIAS_COMPENSATION, WIDTH_OURS: REFIT_COMPENSATION}
WIDTH_SKIPPED_LAYERS = {"llm-pruner": (4 / 32, 2 / 32)}
# model_type -> the config keys that give o_proj and down_proj a bias (FLAP's compensation, saved in a stock folder);
# and the families whose FFN has no block of its own for the refit to run.
BIAS_CONFIG_KEYS = {"llama": ("attention_bias", "mlp_bias")}
NO_MLP_BLOCK = ("opt",)
# What a width budget is a share of: non-embedding parameters, FLOPs of a forward pass, KV-cache bytes per token.
WIDTH_BUDGETS = ("parameters", "flops", "kv-bytes")
# How the project's method spreads the budget over the layers: global (each layer its own width) or uniform (one
# width every layer, a stock folder).
WIDTH_ALLOCATIONS = ("global", "uniform")


def kind_method(kind: str) -> str:
    """The curve of one attention kind pruned alone (Figure 5)."""
    return f"{IMPORTANCE}-{kind}"


def checkpoint_method(step: int) -> str:
    """The curve of a training checkpoint pruned by its own importance (Figure 6)."""
    return f"checkpoint-{step}"


# --- an experiment's folders (artifacts/<experiment>/) --------------------------------------------
BASE_MODEL_DIR, DATA_DIR, FINETUNED_DIR = "base_model", "data", "finetuned"
PRUNED_DIR, CHECKPOINTS_DIR = "pruned", "checkpoints"
WIDTH_DIR = "width"  # language models: the width stage's saved models
GGUF_DIR = "gguf"  # language models: the export stage's GGUF files of the saved models
GGUF_TYPES = ("f32", "f16", "q8_0")  # the GGUF weight types whose round trip is tested (pipeline/export/gguf.py)
# runtime.placement sharded with a "disk" cap: the weights accelerate offloads, a fresh folder per loaded model
OFFLOAD_DIR = "offload"
RECOVERED_DIR = "recovered"  # language models: each saved pruned model after recovery fine-tuning, by the same name
TASK_FILE = "task.json"  # in the data folder: labels, metric, languages
PRUNING_FILE = "head_pruning.json"  # in a pruned model folder: the heads and neurons removed
FAIRSEQ_CHECKPOINT = "checkpoint.pt"  # the model file of a fairseq model folder, beside its dict.<lang>.txt


def pruned_name(fraction: float) -> str:
    """The folder of the model with `fraction` of its heads pruned: 0.3 -> "30"."""
    return f"{round(100 * fraction):02d}"


def width_name(level: float) -> str:
    """The folder of the width stage's model with `level` of its budget removed: 0.2 -> "width-20"."""
    return f"width-{round(100 * level):02d}"


def width_label(level: float, budget: str) -> str:
    """The width stage's saved model in the tables: 0.2, "parameters" -> "20% of parameters (width)"."""
    return f"{level:.0%} of {budget} (width)"


def kv_groups_name(fraction: float) -> str:
    """The folder of the serving-shape model, `fraction` of every layer's KV groups removed: 0.5 -> "kv-groups-50"."""
    return f"kv-groups-{round(100 * fraction):02d}"


# The `widths` of a budgeted-tuned model in benchmark_budgeted.csv (prune.budgeted.width_multiple).
FULL_WIDTHS, ROUNDED_WIDTHS, SEARCHED_WIDTHS = "full", "rounded", "as searched"


def budgeted_name(level: float, unrounded: bool = False) -> str:
    """The folder of the budgeted-tuned model with `level` of its cost removed: 0.4 -> "budgeted-40"; its twin
    searched without the neuron multiple (prune.budgeted.width_multiple): "budgeted-40-unrounded"."""
    return f"{BUDGETED_TUNED.removesuffix('-tuned')}-{round(100 * level):02d}" + ("-unrounded" if unrounded else "")


def checkpoint_name(step: int) -> str:
    """The folder of the training checkpoint after `step` optimisation steps."""
    return f"step-{step:06d}"


def checkpoint_step(name: str) -> int | None:
    """The step of a checkpoint folder's name, or None when the name is not one."""
    prefix = "step-"
    return int(name.removeprefix(prefix)) if name.startswith(prefix) and name[len(prefix):].isdigit() else None


# The benchmark columns (and benchmark.json keys) that are wall-clock measurements, so no two runs agree on them.
BENCHMARK_TIMINGS = frozenset({"examples_per_s", "tokens_per_s", "speedup", "speedup_q1", "speedup_q3", "speedup_min",
                               "speedup_max", "floor_share", "amdahl_speedup"})


# --- the DVC metrics: each stage's headline numbers, one small vocabulary for every family ---------------------
# `dvc metrics show` prints one table whose columns are the union of the flattened keys of every declared metrics
# file of every pipeline, so the files share these keys, hold numbers only (a key with no value is left out, never
# None) but for PRECISION_METRIC, at most METRICS_PER_FILE each, and the union stays at most METRICS_UNION, 30
# columns with the Path (tests/test_dvc_metrics.py).
# Everything else a stage found goes to a CSV declared as a plot, and descriptions to a JSON declared as an out.
METRICS_PER_FILE, METRICS_UNION = 20, 29
# Every metrics file of a stage that runs a model also holds the precision it ran at on that machine, one of
# PRECISIONS (what `runtime.precision: auto` resolved to): the one string among the numbers, which `dvc metrics
# diff` shows beside them. The stages without a metrics file (score, recover, export) write it as a column.
PRECISION_METRIC = "precision"
# finetune.json: the metric on each of EVAL_SPLITS, and the training's steps, seconds and last loss (no loss when
# nothing was trained). What the metric is, and the model and data, are in about.json.
TRAIN_STEPS, TRAIN_SECONDS, TRAIN_LOSS_LAST = "train_steps", "train_seconds", "train_loss_last"
# ablate.json: how many single-head removals are significant (p < ALPHA), how many of them improve the metric, the
# worst single-head delta and the worst layer with one head (one key/value group) kept; ablation.csv has the rest.
SIGNIFICANT, SIGNIFICANT_IMPROVING = "significant", "significant_improving"
WORST_DELTA, WORST_ONE_HEAD_DELTA = "worst_delta", "worst_one_head_delta"
WORST_ONE_GROUP_DELTA = "worst_one_group_delta"
# prune.json, per evaluation split: the largest fraction of heads pruned within tolerance (`within_tolerance`: 1 point
# of accuracy or BLEU, 5% of perplexity) on the importance curve, the metric there, and the unpruned model's.
PRUNABLE_FRACTION, METRIC_AT_PRUNABLE, UNPRUNED_METRIC = "prunable_fraction", "metric_at_prunable", "unpruned"
# benchmark.json: Table 4's headline, the most pruned saved model (FRACTION_PRUNED of its heads removed) at the
# largest batch, at the first attention implementation and the runtime's precision (a language model: cached
# decoding): its median speedup and its FLOP ideal; under BUDGETED_SUMMARY the same for the most pruned saved
# budgeted-tuned model (BUDGET_REMOVED of the cost removed). benchmark.csv and llm_benchmark.csv have every model.
FRACTION_PRUNED, BATCH_SIZE, SPEEDUP, IDEAL_SPEEDUP = "fraction_pruned", "batch_size", "speedup", "ideal_speedup"
BUDGETED_SUMMARY, BUDGET_REMOVED = "budgeted", "budget_removed"
# zero_shot.json: mean zero-shot accuracy (lm-eval's acc over the tasks, 0-1) of the unpruned model, of the most
# pruned saved model (FRACTION_PRUNED, as benchmark.json's) and of that model after recovery; zero_shot.csv has all.
PRUNED_METRIC, RECOVERED_METRIC = "pruned", "recovered"
# width.json: test perplexity at the headline level (the one of width.levels nearest 20% of width.budget, the share
# pruning tools report most) of the project's method (WIDTH_OURS), of the best peer (each with its own
# compensation) and of the unpruned model; width_curve.csv has every level.
BEST_PEER = "best_peer"
# The flattened keys each metrics file may hold (`dvc metrics show`'s columns).
METRICS_KEYS = {
    "finetune.json": (*EVAL_SPLITS, TRAIN_STEPS, TRAIN_SECONDS, TRAIN_LOSS_LAST, PRECISION_METRIC),
    "ablate.json": (SIGNIFICANT, SIGNIFICANT_IMPROVING, WORST_DELTA, WORST_ONE_HEAD_DELTA, WORST_ONE_GROUP_DELTA,
                    PRECISION_METRIC),
    "prune.json": tuple(f"{split}.{key}" for split in EVAL_SPLITS
                        for key in (PRUNABLE_FRACTION, METRIC_AT_PRUNABLE, UNPRUNED_METRIC)) + (PRECISION_METRIC,),
    "benchmark.json": (FRACTION_PRUNED, BATCH_SIZE, SPEEDUP, IDEAL_SPEEDUP,
                       *(f"{BUDGETED_SUMMARY}.{key}" for key in (BUDGET_REMOVED, SPEEDUP, IDEAL_SPEEDUP)),
                       PRECISION_METRIC),
    "zero_shot.json": (UNPRUNED_METRIC, PRUNED_METRIC, RECOVERED_METRIC, FRACTION_PRUNED, PRECISION_METRIC),
    "width.json": (UNPRUNED_METRIC, WIDTH_OURS, BEST_PEER, PRECISION_METRIC),
}

# --- what the prune stage writes beside prune.json ----------------------------------------------------------
# budgeted.json (BUDGETED_FILE, not a metric): how the budgeted comparison (pipeline/methods/comparison.py) ran: the
# cost cut (prune.budgeted.budget), the FFN widths' multiple with what budgeted-tuned scores without it (UNROUNDED,
# {split@level: metric}), by level whether budgeted-tuned kept its tuning and where budgeted-heads' heads came from,
# and under a latency budget the per-layer timings measured (LATENCY_TABLE). Its metrics are in budgeted_curve.csv.
BUDGET, SECONDS, WIDTHS = "budget", "seconds", "widths"
MULTIPLE, UNROUNDED, WHOLE_PRUNE, LATENCY_TABLE = "multiple", "unrounded", "whole_prune", "latency_table"
TUNING_KEPT, HEADS_FROM = "tuning_kept", "heads_from"
# prune_seconds.csv: where the stage's minutes went, one row per part (a `level` for the budgeted parts at one
# level, e.g. WHOLE_PRUNE: Kwon's headline cost, Fisher pass to tuned model).
# kv_groups.csv: each serving-shape model's key/value heads per layer (prune.kv_group_fractions), and whether it is a
# stock Hugging Face folder (STOCK; why not: NOT_STOCK_BECAUSE, as a pruned folder's PRUNING_FILE says,
# pipeline/core/checkpoint.py).
STOCK, NOT_STOCK_BECAUSE = "stock", "not_stock_because"
# rank_correlation.csv (translation trained here, Figure 6): the Spearman rank correlation of each training
# checkpoint's head importance with the final model's.


def at_level(name: str, level: float) -> str:
    """A summary key for `name` (a method, a split, a part of the prune) at a budget level: "budgeted-tuned@0.4"."""
    return f"{name}@{level:g}"


def name_and_level(key: str) -> tuple[str, float | None]:
    """The inverse of `at_level`: "budgeted-tuned@0.4" -> ("budgeted-tuned", 0.4); a key of no level (a part of the
    prune that serves every level, "fisher_and_costs") -> (key, None)."""
    name, at, level = key.rpartition("@")
    return (name, float(level)) if at else (key, None)


# The `model` labels of llm_benchmark.csv: the reference, and the pruned models the report looks up.
UNPRUNED_MODEL = "unpruned"


def kv_groups_label(fraction: float) -> str:
    """The serving-shape model with `fraction` of every layer's KV groups removed: 0.5 -> "50% of KV groups"."""
    return f"{fraction:.0%} of KV groups"


# --- the files an experiment writes (reports/<experiment>/), which the report and dvc.yaml read -----------
# The stages' summaries, DVC metrics (dvc.yaml; their keys: METRICS_KEYS); the report also reads finetune.json and
# prune.json.
FINETUNE_SUMMARY, PRUNE_SUMMARY = "finetune.json", "prune.json"
ABLATE_SUMMARY, BENCHMARK_SUMMARY = "ablate.json", "benchmark.json"
# Not metrics (DVC outs, in git): what the experiment is, for the report's title and credits (the finetune stage),
# and how the budgeted comparison ran (the prune stage).
ABOUT_FILE, BUDGETED_FILE = "about.json", "budgeted.json"
# task.json's keys (TASK_FILE, written by the prepare stage), which about.json repeats for the report: the metric
# (one of CLASSIFICATION_METRICS, BLEU, PERPLEXITY), the model and data by name, and the data's attribution. A family
# adds its own descriptions (translation: the BLEU signature and beams; language modelling: texts and tokens per
# split, the unigram baseline's test perplexity).
TASK_METRIC, TASK_MODEL, TASK_DATA, TASK_DATA_ATTRIBUTION = "metric", "model", "data", "data_attribution"
# The tables, and the columns every reader relies on.
IMPORTANCE_TABLE, ABLATION_TABLE = "importance.csv", "ablation.csv"
ONE_HEAD_TABLE, ONE_GROUP_TABLE = "one_head.csv", "one_group.csv"
CURVE_TABLE, BUDGETED_TABLE, LAYERS_TABLE = "pruning_curve.csv", "budgeted_curve.csv", "budgeted_layers.csv"
# Grouped-query attention with prune.compare_units: every curve of CURVE_TABLE again in the other unit.
OTHER_UNIT_CURVE_TABLE = "pruning_curve_other_unit.csv"
RECOVERY_TABLE, TRAINING_LOSS_TABLE = "recovery.csv", "training_loss.csv"  # the latter: models trained from scratch
PRUNE_SECONDS_TABLE, KV_GROUPS_TABLE, RANK_CORRELATION_TABLE = (
    "prune_seconds.csv", "kv_groups.csv", "rank_correlation.csv")
# Language models: zero-shot accuracy through lm-evaluation-harness, and greedy completions of fixed prompts.
ZERO_SHOT_TABLE, GENERATIONS_TABLE, ZERO_SHOT_SUMMARY = "zero_shot.csv", "generations.csv", "zero_shot.json"
ZERO_SHOT_DIR = "zero_shot"  # in the data folder: the zero-shot tasks' questions (JSONL), which prepare samples
# Language models' width stage: every method x compensation x level x corpus, and its headline (a DVC metric).
WIDTH_TABLE, WIDTH_SUMMARY = "width_curve.csv", "width.json"
GGUF_TABLE = "gguf.csv"  # language models' export stage: each saved model's GGUF files
BENCHMARK_TABLE, BUDGETED_BENCHMARK_TABLE, LLM_BENCHMARK_TABLE = (
    "benchmark.csv", "benchmark_budgeted.csv", "llm_benchmark.csv")
TABLE_COLUMNS = {
    IMPORTANCE_TABLE: ["kind", "layer", "head", "importance"],
    ABLATION_TABLE: ["kind", "layer", "head", "metric", "delta", "p_value"],
    ONE_HEAD_TABLE: ["kind", "layer", "best_head", "metric", "delta"],
    ONE_GROUP_TABLE: ["kind", "layer", "best_group", "heads", "metric", "delta"],  # grouped-query attention only
    CURVE_TABLE: ["method", "split", "fraction_pruned", "metric"],
    OTHER_UNIT_CURVE_TABLE: ["unit", "method", "split", "fraction_pruned", "heads_pruned", "metric"],
    BUDGETED_TABLE: ["method", "split", "budget_removed", "fraction_flops_removed", "heads_pruned",
                     "neurons_pruned", "metric", "examples", "seconds", "collapsed"],
    # What each budgeted model keeps, layer by layer (unit: heads or neurons; of: the unpruned model's count).
    LAYERS_TABLE: ["method", "budget_removed", "unit", "kind", "layer", "kept", "of"],
    RECOVERY_TABLE: ["fraction_pruned", "metric_before", "metric_after"],
    # model: UNPRUNED_MODEL or a saved model's label; value: the task's accuracy (0-1) over `items` questions.
    ZERO_SHOT_TABLE: ["model", "task", "metric", "value", "stderr", "items"],
    GENERATIONS_TABLE: ["model", "prompt", "completion"],
    # perplexity_*: test perplexity of the saved folder and of the GGUF file read back by transformers' GGUF loader.
    GGUF_TABLE: ["model", "type", "safetensors_mib", "gguf_mib", "perplexity_folder", "perplexity_gguf",
                 "not_exported_because"],
    # own: the compensation is the method's published one; level: the share of width.budget to remove (0: the
    # unpruned model); params_removed: the share of non-embedding parameters the model really lost; seconds: its
    # selection and compensation.
    WIDTH_TABLE: ["method", "compensation", "own", "allocation", "level", "corpus", "perplexity", "vs_unpruned",
                  "params_removed", "kv_bytes_per_token", "seconds"],
    TRAINING_LOSS_TABLE: ["step", "loss"],
    PRUNE_SECONDS_TABLE: ["part", "level", "seconds"],  # level: empty for a part that serves every level
    KV_GROUPS_TABLE: ["fraction_removed", "layer", "kv_heads", STOCK, NOT_STOCK_BECAUSE],
    RANK_CORRELATION_TABLE: ["step", "spearman"],
    # device: torch's name of the GPU, or "cpu"; precision: one of PRECISIONS (the benchmark's autocast).
    # speedup: the median over the benchmark's rounds of the per-round ratio; speedup_q1, speedup_q3: its quartiles;
    # speedup_min, speedup_max: its range, the confidence interval for the median (pipeline/core/timer.py).
    # Encoders' rows also have floor_share and amdahl_speedup, as the budgeted table (translation's decoding has none).
    BENCHMARK_TABLE: ["fraction_pruned", "batch_size", "attn_implementation", "examples_per_s", "speedup",
                      "speedup_q1", "speedup_q3", "speedup_min", "speedup_max", "ideal_speedup", "device", "precision"],
    # widths: FULL_WIDTHS (unpruned), ROUNDED_WIDTHS (to the measured neuron multiple), SEARCHED_WIDTHS (without).
    # floor_share: the median over the rounds of a floor model's time (one head and one FFN neuron a layer) over the
    # unpruned model's; amdahl_speedup: the row's speedup if the rest shrank with the FLOPs (pipeline/methods/bench.py).
    BUDGETED_BENCHMARK_TABLE: ["attn_implementation", "batch_size", "budget_removed", "widths", "examples_per_s",
                               "speedup", "speedup_q1", "speedup_q3", "speedup_min", "speedup_max", "ideal_speedup",
                               "floor_share", "amdahl_speedup", "params", "device", "precision"],
    # phase: prefill or decode (pipeline/methods/llm_bench.py); ideals from FLOPs and from KV-cache bytes per token.
    LLM_BENCHMARK_TABLE: ["model", "batch_size", "phase", "tokens_per_s", "speedup", "speedup_q1", "speedup_q3",
                          "speedup_min", "speedup_max", "ideal_speedup_flops", "ideal_speedup_kv", "kv_bytes_per_token",
                          "peak_memory_mb", "params", "device", "precision"],
}
