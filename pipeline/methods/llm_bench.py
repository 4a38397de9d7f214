"""Speed and memory of decoder-only language models, unpruned vs physically pruned, beside the ideal speedups: the
benchmark stage's measure, and on a small random Llama the study `python -m pipeline.studies.llm_bench`.

Two phases, each timed on its own for `repeats` rounds after a warm-up: the models take turns within each
round (each called back to back until its calls have lasted `turn_seconds`; the round keeps their median), and
the phases and batch sizes take turns too, so each one's rounds span the whole run
(`pipeline.core.timer.spread_times`). A speedup is the median of the rounds' ratios, with its interquartile
range (`speedup_q1`, `speedup_q3`) and its range (`speedup_min`, `speedup_max`, `pipeline.core.timer.Ratio`):
- prefill: one forward pass over a prompt batch that builds the KV cache (and the last position's logits, as
  `generate` computes them), in prompt tokens/s;
- decode: `new_tokens` greedy steps, each one token per sequence reading and extending that cache, in generated
  tokens/s. The prefill is not in the timer: every repeat crops the cache back to the prompt and decodes again.

Beside each measured speedup over the reference model (the first) are two ideals: the ratio of FLOPs (of the
prefill, or of one decode step at the mean context length) and the ratio of KV-cache bytes per token, which is
what decoding reads from memory besides the weights, and what bounds the batch a memory holds.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pandas as pd
import torch
import transformers
from torch import nn

from pipeline.core.flops import forward_flops, parameter_count
from pipeline.core.importance import HeadChoice
from pipeline.core.placement import input_device
from pipeline.core.runtime import CPU_FP32, Runtime
from pipeline.core.sites import attention_sites
from pipeline.core.surgery import prune_heads
from pipeline.core.timer import peak_allocated_mib, ratio_columns, speedup_ratio, spread_times
from pipeline.methods.bench import random_inputs, runtime_columns, weights_mib

PREFILL, DECODE = "prefill", "decode"
# The table's columns (and the device/precision of `runtime_columns`).
MODEL, BATCH_SIZE, PHASE = "model", "batch_size", "phase"
PROMPT_TOKENS, NEW_TOKENS = "prompt_tokens", "new_tokens"
TOKENS_PER_S, SPEEDUP = "tokens_per_s", "speedup"
IDEAL_SPEEDUP_FLOPS, IDEAL_SPEEDUP_KV = "ideal_speedup_flops", "ideal_speedup_kv"
KV_BYTES_PER_TOKEN, PEAK_MEMORY_MB, PARAMS = "kv_bytes_per_token", "peak_memory_mb", "params"

def kv_cache_bytes(cache: transformers.Cache) -> int:
    """Bytes of every key and value tensor a cache holds, as measured from the tensors themselves.

    A layer whose heads were all pruned still appends a width-1 placeholder per token
    (`pipeline.core.surgery._update_cache_with_no_heads`, which keeps the cache's length right); it is counted,
    since it is really there.
    """
    total = 0
    for layer in cache.layers:
        if layer.is_initialized:
            total += layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
    return total


def prefill(model: nn.Module, prompt: Mapping[str, torch.Tensor]) -> transformers.utils.ModelOutput:
    """One forward pass over the prompt that returns its KV cache (`.cache`) and the last position's logits."""
    return model(**prompt, use_cache=True, logits_to_keep=1)


def decode_greedy(model: nn.Module, cache: transformers.Cache, tokens: torch.Tensor, attention_mask: torch.Tensor,
                  new_tokens: int) -> torch.Tensor:
    """`new_tokens` greedy steps from `tokens` (`[batch, 1]`, the token after the cached ones) with the KV cache:
    each step feeds one token per sequence, appends its keys and values to `cache`, and picks the next token.
    Returns the `[batch, new_tokens]` tokens picked. Prompts are unpadded (`attention_mask` all ones), as in the
    benchmark, so positions follow the cache's length as `generate`'s do."""
    picked = []
    for _ in range(new_tokens):
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(attention_mask.shape[0], 1)], dim=1)
        logits = model(input_ids=tokens, attention_mask=attention_mask, cache=cache, use_cache=True).logits
        tokens = logits[:, -1].argmax(dim=-1, keepdim=True)
        picked.append(tokens)
    return torch.cat(picked, dim=1)


def generate_greedy(model: nn.Module, prompt: Mapping[str, torch.Tensor], new_tokens: int) -> torch.Tensor:
    """A whole greedy generation of `new_tokens + 1` tokens: the prefill's pick, then `decode_greedy`'s."""
    out = prefill(model, prompt)
    first = out.logits[:, -1].argmax(dim=-1, keepdim=True)
    return torch.cat([first, decode_greedy(model, out.cache, first, prompt["attention_mask"], new_tokens)], dim=1)


def prefill_flops(model: nn.Module, prompt: Mapping[str, torch.Tensor]) -> int:
    """FLOPs of the prefill of one sequence of the prompt (the ratio between models is the same at every batch)."""
    return forward_flops(model, {k: v[:1] for k, v in prompt.items()} | {"use_cache": True, "logits_to_keep": 1})


def decode_step_flops(model: nn.Module, context: int) -> int:
    """FLOPs of one decode step of one sequence with `context` tokens in the cache. Attention's FLOPs grow
    linearly with the context, so the step at the mean context of a run costs the mean of its steps."""
    device = input_device(model)  # a sharded model's first layer's device
    prompt = {k: v.to(device) for k, v in random_inputs(model, 1, context).items()}
    with torch.inference_mode():
        cache = prefill(model, prompt).cache
    mask = torch.ones(1, context + 1, dtype=torch.long, device=device)
    return forward_flops(model, {"input_ids": prompt["input_ids"][:, -1:], "attention_mask": mask, "cache": cache})


@dataclass(frozen=True)
class PhaseRuns:
    """One model's two phases on one prompt batch, ready to time; a whole generation from nothing, whose peak
    memory is the decode phase's; and the bytes of the cache the prompt fills."""

    prefill: Callable[[], object]
    decode: Callable[[], object]
    generate: Callable[[], object]
    prompt_cache_bytes: int


@torch.inference_mode()
def phase_runs(model: nn.Module, prompt: Mapping[str, torch.Tensor], new_tokens: int,
               runtime: Runtime = CPU_FP32) -> PhaseRuns:
    """The prefill of `prompt`, and `new_tokens` greedy decode steps from its cache. Each decode call first crops
    the cache back to the prompt, so every call does the same steps and none includes a prefill."""
    prompt_tokens = prompt["input_ids"].shape[1]
    with runtime.autocast():  # the cache holds what the timed passes compute: autocast's dtype for bf16/fp16
        out = prefill(model, prompt)
    cache, first = out.cache, out.logits[:, -1].argmax(dim=-1, keepdim=True)

    def decode() -> None:
        cache.crop(-(cache.get_seq_length() - prompt_tokens))
        decode_greedy(model, cache, first, prompt["attention_mask"], new_tokens)

    return PhaseRuns(lambda: prefill(model, prompt), decode, lambda: generate_greedy(model, prompt, new_tokens),
                     kv_cache_bytes(cache))


def llm_benchmark(models: Mapping[str, nn.Module], batch_sizes: Sequence[int], prompt_tokens: int, new_tokens: int,
                  repeats: int, runtime: Runtime = CPU_FP32, turn_seconds: float = 0.0) -> pd.DataFrame:
    """One row per (model label, batch size, phase): measured tokens/s, KV bytes per token and peak memory (the
    weights plus the peak allocated by the prefill, or by a whole generation for decode: the torch allocator's
    own count, `peak_allocated_mib`, on the CPU as on a GPU), the speedup over the first model, and the ideal
    speedups from FLOPs and from KV bytes per token. The models must
    be on the runtime's device; all are timed at the runtime's precision in the same run, so ratios compare like
    with like."""
    reference = next(iter(models))
    # The prompts go where the reference model takes its inputs: runtime.device, or a sharded model's first layer's.
    device = input_device(models[reference])
    probe = {k: v.to(device) for k, v in random_inputs(models[reference], 1, prompt_tokens).items()}
    flops = {label: {PREFILL: prefill_flops(model, probe),
                     DECODE: decode_step_flops(model, prompt_tokens + new_tokens // 2)}
             for label, model in models.items()}
    prompts = {b: {k: v.to(device) for k, v in random_inputs(models[reference], b, prompt_tokens).items()}
               for b in batch_sizes}
    runs = {b: {label: phase_runs(model, prompts[b], new_tokens, runtime) for label, model in models.items()}
            for b in batch_sizes}
    phase_fns = {PREFILL: lambda r: r.prefill, DECODE: lambda r: r.decode}
    with torch.inference_mode():  # one group per batch size and phase, their rounds spread over the whole run
        seconds = spread_times({(b, phase): {label: fn(r) for label, r in runs[b].items()}
                                for b in batch_sizes for phase, fn in phase_fns.items()}, repeats, runtime,
                               turn_seconds)
    rows = []
    for batch_size in batch_sizes:
        tokens = {PREFILL: batch_size * prompt_tokens, DECODE: batch_size * new_tokens}
        kv_per_token = {label: r.prompt_cache_bytes / (batch_size * prompt_tokens)
                        for label, r in runs[batch_size].items()}
        for label, model in models.items():
            run = runs[batch_size][label]
            with torch.inference_mode():
                # Allocated from nothing but the weights and inputs: the prefill alone, and a whole generation
                # (its prefill, then the decode that grows and copies the cache), so no cache predates the count.
                peak = {PREFILL: peak_allocated_mib(run.prefill, runtime),
                        DECODE: peak_allocated_mib(run.generate, runtime)}
            for phase in (PREFILL, DECODE):
                timed = seconds[batch_size, phase]
                rows.append({
                    MODEL: label, BATCH_SIZE: batch_size, PHASE: phase, PROMPT_TOKENS: prompt_tokens,
                    NEW_TOKENS: new_tokens if phase == DECODE else 0,
                    TOKENS_PER_S: tokens[phase] / statistics.median(timed[label]),
                    KV_BYTES_PER_TOKEN: kv_per_token[label],
                    PEAK_MEMORY_MB: weights_mib(model) + peak[phase],
                    **ratio_columns(speedup_ratio(timed[reference], timed[label]), SPEEDUP),
                    IDEAL_SPEEDUP_FLOPS: flops[reference][phase] / flops[label][phase],
                    IDEAL_SPEEDUP_KV: kv_per_token[reference] / kv_per_token[label],
                    PARAMS: parameter_count(model), **runtime_columns(runtime),
                })
    return pd.DataFrame(rows)


def without_kv_groups(model: nn.Module, fraction: float, seed: int = 0) -> nn.Module:
    """`model` with `fraction` of every layer's key/value groups removed, each with its query heads (whole groups,
    the same number per layer). Random weights make all groups alike, so a seeded random order chooses them."""
    sites = attention_sites(model)
    choice = HeadChoice("group", uniform=True)
    count = round(fraction * sum(site.num_heads for site in sites))
    return prune_heads(model, choice.select(choice.random(sites, seed), sites, count))
