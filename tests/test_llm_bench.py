"""Specification of the decoder-only benchmark (pipeline/methods/llm_bench.py) on tiny models: the KV cache it
measures, the greedy decode loop it times, and the table it returns."""

from __future__ import annotations

import pytest
import torch

from pipeline.core.sites import attention_sites
from pipeline.core.surgery import prune_heads
from pipeline.methods import llm_bench
from pipeline.methods.bench import random_inputs
from pipeline.methods.llm_bench import (
    DECODE,
    IDEAL_SPEEDUP_FLOPS,
    IDEAL_SPEEDUP_KV,
    KV_BYTES_PER_TOKEN,
    PREFILL,
    decode_greedy,
    generate_greedy,
    kv_cache_bytes,
    llm_benchmark,
    prefill,
    without_kv_groups,
)
from tests.tiny_models import tiny_model


def kv_bytes_per_token(model, batch_size: int = 2, tokens: int = 5) -> float:
    prompt = random_inputs(model, batch_size, tokens)
    with torch.inference_mode():
        return kv_cache_bytes(prefill(model, prompt).cache) / (batch_size * tokens)


def test_kv_bytes_per_token_are_every_layers_keys_and_values():
    model = tiny_model("llama")  # 3 layers, 2 key/value heads of head_dim 6, fp32
    assert kv_bytes_per_token(model) == 3 * 2 * (2 * 6) * 4


@pytest.mark.parametrize("removed", [1, 2])
def test_kv_bytes_per_token_fall_exactly_in_proportion_to_the_kv_heads_removed(removed):
    model = tiny_model("llama", seed=1)
    before = kv_bytes_per_token(model)
    sites = attention_sites(model)
    kv_heads = sum(site.num_kv_heads for site in sites)
    # Whole groups, unequally over the layers: `removed` from layer 0 (all of it when 2), one from layer 2.
    plan = {0: [h for group in sites[0].head_groups[:removed] for h in group], 2: sites[2].head_groups[1]}
    prune_heads(model, plan)
    gone = kv_heads - sum(site.num_kv_heads for site in attention_sites(model))
    per_kv_head = before / kv_heads
    # An emptied layer (removed=2) still caches its width-1 placeholder keys and values: 2 elements per token.
    placeholder = 2 * 4 if removed == 2 else 0
    assert kv_bytes_per_token(model) == before - gone * per_kv_head + placeholder


def test_half_the_kv_groups_removed_uniformly_halves_the_kv_bytes_per_token():
    model = tiny_model("llama")
    before = kv_bytes_per_token(model)
    pruned = without_kv_groups(tiny_model("llama"), 0.5)
    assert [site.num_kv_heads for site in attention_sites(pruned)] == [1, 1, 1]
    assert kv_bytes_per_token(pruned) == before / 2


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_the_decode_loop_extends_the_cache_by_one_token_a_step_and_decodes_as_generate_does(family):
    model = tiny_model(family)
    prompt = random_inputs(model, 3, 6)
    with torch.inference_mode():
        out = prefill(model, prompt)
        first = out.logits[:, -1].argmax(dim=-1, keepdim=True)
        tokens = decode_greedy(model, out.cache, first, prompt["attention_mask"], new_tokens=5)
        assert out.cache.get_seq_length() == 6 + 5
        generated = model.generate(**prompt, do_sample=False, min_new_tokens=6, max_new_tokens=6, pad_token_id=0)
        assert torch.equal(generate_greedy(model, prompt, new_tokens=5), generated[:, 6:])
    assert torch.equal(torch.cat([first, tokens], dim=1), generated[:, 6:])


def test_the_table_has_one_row_per_model_batch_size_and_phase_with_the_ideals_beside_the_measures(monkeypatch):
    models = {"unpruned": tiny_model("llama"), "half the KV groups": without_kv_groups(tiny_model("llama"), 0.5)}
    decoded = []
    real_decode = llm_bench.decode_greedy

    def counting_decode(model, cache, tokens, mask, new_tokens):
        result = real_decode(model, cache, tokens, mask, new_tokens)
        decoded.append(cache.get_seq_length())
        return result

    monkeypatch.setattr(llm_bench, "decode_greedy", counting_decode)
    table = llm_benchmark(models, batch_sizes=[1, 3], prompt_tokens=6, new_tokens=4, repeats=2)
    assert list(table.columns) == [
        "model", "batch_size", "phase", "prompt_tokens", "new_tokens", "tokens_per_s", "kv_bytes_per_token",
        "peak_memory_mb", "speedup", "speedup_q1", "speedup_q3", "speedup_min", "speedup_max", "ideal_speedup_flops",
        "ideal_speedup_kv", "params", "device", "precision"]
    assert list(zip(table["model"], table["batch_size"], table["phase"], strict=True)) == [
        (model, batch, phase) for batch in (1, 3) for model in models for phase in (PREFILL, DECODE)]
    # Every decode (warm-up, timed repeats, the generation measured for memory) starts from the prompt's cache and
    # adds its 4 tokens.
    assert decoded and set(decoded) == {6 + 4}
    assert (table["tokens_per_s"] > 0).all() and (table["peak_memory_mb"] > 0).all()
    reference, pruned = table[table["model"] == "unpruned"], table[table["model"] != "unpruned"]
    assert (reference["speedup"] == 1.0).all() and (reference[IDEAL_SPEEDUP_FLOPS] == 1.0).all()
    assert (pruned[IDEAL_SPEEDUP_KV] == 2.0).all()
    assert (pruned[KV_BYTES_PER_TOKEN].to_numpy() == reference[KV_BYTES_PER_TOKEN].to_numpy() / 2).all()
    assert (pruned[IDEAL_SPEEDUP_FLOPS] > 1.0).all()
    assert table.loc[table["phase"] == DECODE, "new_tokens"].eq(4).all()
    assert table.loc[table["phase"] == PREFILL, "new_tokens"].eq(0).all()
    # A decode row's memory is a whole generation's, which runs its prefill first.
    memory = table.pivot_table(index=["model", "batch_size"], columns="phase", values="peak_memory_mb")
    assert (memory[DECODE] >= memory[PREFILL]).all()

