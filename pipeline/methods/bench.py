"""Throughput of unpruned vs physically pruned encoders, beside the ideal speedup from FLOPs: the benchmark stage's
measure, and on random weights (`random_encoder`, `throughput_table`) the study `python -m pipeline.studies.bench`.

Random weights are enough for speed. The models of one shape and batch size take turns for `repeats` rounds
after a warm-up, and the batch sizes take turns too, so each one's rounds span the whole measurement
(`spread_times`, pipeline/core/timer.py). In its turn each model is called back to back until its calls have
lasted `turn_seconds`, as a model serving one batch after another runs, and the round keeps the median of its
calls: a cheap call (batch 1) is then timed many times, so the odd slow call (the first after another model's, or
one the machine interrupts) does not decide a round.
A speedup is the median of the rounds' ratios to the unpruned model's time in the same round, with its
interquartile range (`speedup_q1`, `speedup_q3`) and its range (`speedup_min`, `speedup_max`). The range of n
rounds is a distribution-free confidence interval for the median ratio (it misses the median with probability
2 / 2**n: 98% at 7 rounds), so two runs whose ranges do not overlap differ by more than the machine's noise.

Pruning cannot shrink all of a forward pass: embeddings, LayerNorms, residual adds, the attention mask, the task
head and each call's fixed overhead stay. `floor_model` keeps only that (one head and one FFN neuron a layer);
timed beside the others it gives each model its Amdahl estimate (`amdahl_speedup`): the speedup if the floor's time
stayed and the rest shrank exactly with the FLOPs. It is an estimate, not a bound: the rest need not shrink as the
FLOPs say, and at batch 1 on the 2-core CPU the models that prune heads only beat it (README, "What no pruning
removes", gives each run's figures).
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Callable, Mapping, Sequence

import pandas as pd
import torch
import transformers
from torch import nn

from pipeline.core.flops import forward_flops, parameter_count
from pipeline.core.runtime import CPU_FP32, Runtime
from pipeline.core.sites import attention_sites, ffn_sites
from pipeline.core.surgery import prune_heads, prune_neurons
from pipeline.core.timer import peak_allocated_mib, ratio_columns, speedup_ratio, spread_times

SHAPES = {
    "bert-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "minilm-l6": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
    # 12 heads as the others (so 30/50/70% prune evenly), at a size a CPU test times in seconds.
    "tiny": dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=12, intermediate_size=96,
                 vocab_size=2000, max_position_embeddings=64),
}


def on_device(inputs: Mapping[str, torch.Tensor], runtime: Runtime) -> dict[str, torch.Tensor]:
    return {k: v.to(runtime.device) for k, v in inputs.items()}


def runtime_columns(runtime: Runtime) -> dict[str, str]:
    """The `device` and `precision` columns of every benchmark row (pipeline/files/schema.py)."""
    return {"device": runtime.device_name, "precision": runtime.precision}


def weights_mib(model: nn.Module) -> float:
    """Parameters and buffers, in MiB."""
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]) / 2**20


@torch.inference_mode()
def forward_memory_mb(model: nn.Module, inputs: Mapping[str, torch.Tensor],
                      runtime: Runtime = CPU_FP32) -> dict[str, float]:
    """Weights (parameters and buffers) and the peak of live activation memory during one forward pass
    under the runtime's autocast (`peak_allocated_mib`), in MiB."""
    inputs = on_device(inputs, runtime)
    activations = peak_allocated_mib(lambda: model(**inputs), runtime)
    return {"weights_mb": round(weights_mib(model), 2), "activations_mb": round(activations, 2)}


def evenly_spread_plan(model: nn.Module, fraction: float) -> dict[int, list[int]]:
    """Remove the same number of heads from every layer (the last ones; random weights make all heads alike)."""
    plan = {}
    for index, site in enumerate(attention_sites(model)):
        count = round(site.num_heads * fraction)
        plan[index] = list(range(site.num_heads - count, site.num_heads))
    return plan


def random_encoder(shape: str, attn_implementation: str, seed: int = 0) -> nn.Module:
    config = transformers.BertConfig(**SHAPES[shape], num_labels=2)
    torch.manual_seed(seed)
    return transformers.BertForSequenceClassification._from_config(
        config, attn_implementation=attn_implementation).eval()


def random_inputs(model: nn.Module, batch_size: int, seq_len: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # Ids from the upper vocabulary avoid special tokens (speed does not depend on which tokens they are).
    vocab = model.config.vocab_size
    ids = torch.randint(min(1000, vocab // 2), vocab, (batch_size, seq_len), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def floor_model(model: nn.Module) -> nn.Module:
    """A copy of `model` with only the first of its present heads in every attention site and the first of its
    present neurons in every FFN: what is left to time is the work that pruning does not shrink."""
    floor = copy.deepcopy(model)
    prune_heads(floor, {i: s.kept_heads[1:] for i, s in enumerate(attention_sites(floor))})
    prune_neurons(floor, {i: s.kept_neurons[1:] for i, s in enumerate(ffn_sites(floor))})
    return floor.eval()


def amdahl_speedup(floor_share: float, ideal: float, floor_ideal: float) -> float:
    """Amdahl's law for a model whose FLOP ideal is `ideal`: its speedup if the floor's time stayed and all the rest
    shrank exactly with the FLOPs. The floor takes `floor_share` of the reference's time and has the FLOP ideal
    `floor_ideal`. In fractions of the reference's time and FLOPs, the model takes floor_share + (1 - floor_share) *
    (1/ideal - 1/floor_ideal) / (1 - 1/floor_ideal). A model whose removed work took more than its FLOPs' share
    of the rest beats it (the module docstring)."""
    scalable = (1 / ideal - 1 / floor_ideal) / (1 - 1 / floor_ideal)
    return 1 / (floor_share + (1 - floor_share) * scalable)


FLOOR = "floor"  # the key `measure_throughput` times its floor model under


def measure_throughput(
    models: Mapping[float, nn.Module], batches: Sequence[Mapping[str, torch.Tensor]], repeats: int,
    runtime: Runtime = CPU_FP32, turn_seconds: float = 0.0, floor: nn.Module | None = None,
) -> list[dict]:
    """Examples/s of each model (keyed by fraction pruned; the first is the reference) on each of `batches`, with
    the measured speedup over the reference (the median of the rounds' ratios, their interquartile range and
    their range: `ratio_columns`) beside the ideal (FLOP-count) one: one row per batch and model. Each batch's
    models take turns for `repeats` rounds of `turn_seconds` turns, the batches taking turns too, so every batch's
    rounds span the whole measurement (`spread_times`). The models must be on the runtime's device; every one is
    timed at the runtime's precision, so a speedup compares models at the same precision, batch and attention
    implementation.

    With a `floor` model (`floor_model` of the reference), it takes its turns too, and every row also has
    `floor_share`, the median of the rounds' ratios of the floor's time to the reference's, and `amdahl_speedup`,
    the model's Amdahl estimate from that share; the floor has no row of its own."""
    timed = {**models, **({FLOOR: floor} if floor is not None else {})}
    reference_key = next(iter(models))
    batches = [on_device(inputs, runtime) for inputs in batches]
    ideals = []
    for inputs in batches:
        flops = {f: forward_flops(m, {k: v[:1] for k, v in inputs.items()}) for f, m in timed.items()}
        ideals.append({f: flops[reference_key] / flops[f] for f in timed})
    with torch.inference_mode():
        seconds = spread_times({i: {f: (lambda model=model, inputs=inputs: model(**inputs))
                                    for f, model in timed.items()} for i, inputs in enumerate(batches)},
                               repeats, runtime, turn_seconds)
    rows = []
    for i, inputs in enumerate(batches):
        batch_size, reference = next(iter(inputs.values())).shape[0], seconds[i][reference_key]
        amdahl = {}
        if floor is not None:
            share = speedup_ratio(seconds[i][FLOOR], reference).median
            amdahl = {f: dict(floor_share=share, amdahl_speedup=amdahl_speedup(share, ideals[i][f], ideals[i][FLOOR]))
                      for f in models}
        rows += [dict(
            attn_implementation=model.config._attn_implementation, batch_size=batch_size, fraction_pruned=fraction,
            examples_per_s=batch_size / statistics.median(seconds[i][fraction]),
            **ratio_columns(speedup_ratio(reference, seconds[i][fraction])),
            ideal_speedup=ideals[i][fraction], **amdahl.get(fraction, {}), params=parameter_count(model),
            **runtime_columns(runtime),
        ) for fraction, model in models.items()]
    return rows


def measure_generation(
    models: Mapping[float, nn.Module], batches: Sequence[Mapping[str, torch.Tensor]], new_tokens: int,
    repeats: int, num_beams: int = 1, runtime: Runtime = CPU_FP32, turn_seconds: float = 0.0,
) -> list[dict]:
    """Decoding speed of each encoder-decoder (keyed by fraction pruned; the first is the reference) on each of
    `batches` of source sentences: sentences/s (examples_per_s) and generated tokens/s, beside the ideal speedup
    from the FLOPs of encoding the batch and scoring a target of `new_tokens` tokens. The rounds are spread over
    the measurement as `measure_throughput`'s.

    Every model generates exactly `new_tokens` tokens per sentence (no early stop at </s>), so pruned and
    unpruned models do the same number of decoder steps whatever they translate.
    """
    fractions = list(models)
    batches = [on_device(inputs, runtime) for inputs in batches]

    def probe(model: nn.Module, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        start = torch.full((1, new_tokens), model.config.decoder_start_token_id, device=runtime.device)
        return {k: v[:1] for k, v in inputs.items()} | {"decoder_input_ids": start}

    def generate(model: nn.Module, inputs: Mapping[str, torch.Tensor]) -> Callable[[], object]:
        return lambda: model.generate(**inputs, num_beams=num_beams, do_sample=False, min_new_tokens=new_tokens,
                                      max_new_tokens=new_tokens)

    ideals = []
    for inputs in batches:
        flops = {f: forward_flops(m, probe(m, inputs)) for f, m in models.items()}
        ideals.append({f: flops[fractions[0]] / flops[f] for f in fractions})
    with torch.inference_mode():
        seconds = spread_times({i: {f: generate(model, inputs) for f, model in models.items()}
                                for i, inputs in enumerate(batches)}, repeats, runtime, turn_seconds)
    rows = []
    for i, inputs in enumerate(batches):
        batch_size, reference = inputs["input_ids"].shape[0], seconds[i][fractions[0]]
        for fraction, model in models.items():
            rate = batch_size / statistics.median(seconds[i][fraction])
            rows.append(dict(
                attn_implementation=model.config._attn_implementation, batch_size=batch_size,
                fraction_pruned=fraction, examples_per_s=rate, tokens_per_s=rate * new_tokens,
                **ratio_columns(speedup_ratio(reference, seconds[i][fraction])),
                ideal_speedup=ideals[i][fraction], params=parameter_count(model), **runtime_columns(runtime),
            ))
    return rows


def throughput_table(
    shapes: Sequence[str], fractions: Sequence[float], batch_sizes: Sequence[int], impls: Sequence[str],
    seq_len: int, repeats: int, runtimes: Sequence[Runtime] = (CPU_FP32,), memory: bool = False,
    turn_seconds: float = 0.0,
) -> pd.DataFrame:
    """Every shape x attention x runtime x batch size, all pruned levels side by side (the first fraction is the
    reference), timed by `measure_throughput` with turns of `turn_seconds`. The runtimes share one device; with
    `memory`, each row also has the forward pass's weights and peak activations (`forward_memory_mb`) and their
    sum, `peak_memory_mb`."""
    rows = []
    for shape in shapes:
        for impl in impls:
            models = {}
            for fraction in fractions:
                model = random_encoder(shape, impl)
                models[fraction] = prune_heads(model, evenly_spread_plan(model, fraction)).to(runtimes[0].device)
            for runtime in runtimes:
                batches = {b: random_inputs(models[fractions[0]], b, seq_len) for b in batch_sizes}
                for row in measure_throughput(models, list(batches.values()), repeats, runtime, turn_seconds):
                    if memory:
                        inputs = batches[row["batch_size"]]
                        row |= forward_memory_mb(models[row["fraction_pruned"]], inputs, runtime)
                        row["peak_memory_mb"] = row["weights_mb"] + row["activations_mb"]
                    rows.append({"shape": shape, **row})
                    print(_row_line(rows[-1]), flush=True)
            del models
            if runtimes[0].is_cuda:
                torch.cuda.empty_cache()
    return pd.DataFrame(rows)


def _row_line(row: dict) -> str:
    return (f"{row['shape']:>9} {row['precision']} {row['attn_implementation']:>5} batch {row['batch_size']:>3} "
            f"pruned {row['fraction_pruned']:.0%}: {row['examples_per_s']:8.1f} ex/s  "
            f"speedup {row['speedup']:.3f} [{row['speedup_min']:.3f}, {row['speedup_max']:.3f}] "
            f"(ideal {row['ideal_speedup']:.3f})")
