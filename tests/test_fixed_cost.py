"""The fixed-cost study: a floor model of one head and one neuron a layer, and the Amdahl bound it gives."""

import copy

import pytest
import torch

from pipeline.core.flops import forward_flops
from pipeline.core.sites import attention_sites, ffn_sites
from pipeline.core.surgery import prune_heads
from pipeline.methods.bench import random_encoder, random_inputs
from pipeline.studies.fixed_cost import amdahl_bound, fixed_cost_rows, floor_model


def test_the_floor_model_keeps_one_head_and_one_neuron_in_every_layer_and_leaves_the_model_alone():
    model = random_encoder("tiny", "sdpa")
    floor = floor_model(model)
    assert [s.num_heads for s in attention_sites(floor)] == [1, 1]
    assert [len(s.kept_neurons) for s in ffn_sites(floor)] == [1, 1]
    assert [s.num_heads for s in attention_sites(model)] == [12, 12]
    inputs = random_inputs(model, 2, 16)
    with torch.inference_mode():
        assert floor(**inputs).logits.shape == model(**inputs).logits.shape


def test_the_amdahl_bound_is_the_flop_ratio_without_fixed_work_and_one_when_all_work_is_fixed():
    assert amdahl_bound(t_full=10.0, t_floor=0.0, f_full=100.0, f_pruned=50.0, f_floor=0.0) == pytest.approx(2.0)
    assert amdahl_bound(t_full=10.0, t_floor=10.0, f_full=100.0, f_pruned=50.0, f_floor=10.0) == pytest.approx(1.0)
    # 2 of 10 s fixed, the other 8 s shrink with the scalable FLOPs (90 -> 40): 10 / (2 + 8 * 40 / 90).
    assert amdahl_bound(10.0, 2.0, 100.0, 50.0, 10.0) == pytest.approx(10 / (2 + 8 * 40 / 90))


def test_fixed_cost_rows_time_the_three_models_at_each_batch_size_beside_the_flop_ideal():
    full = random_encoder("tiny", "sdpa")
    pruned = prune_heads(copy.deepcopy(full), {0: range(6), 1: range(6)})
    rows = fixed_cost_rows(full, pruned, batch_sizes=[1, 2], seq_len=16, rounds=3)
    probe = {k: v[:1] for k, v in random_inputs(full, 1, 16).items()}
    assert [r["batch_size"] for r in rows] == [1, 2]
    for r in rows:
        assert r["ideal_speedup"] == pytest.approx(forward_flops(full, probe) / forward_flops(pruned, probe))
        flops = [forward_flops(m, probe) for m in (full, pruned, floor_model(full))]
        assert r["amdahl_bound"] == pytest.approx(amdahl_bound(r["full_ms"], r["floor_ms"], *flops))
