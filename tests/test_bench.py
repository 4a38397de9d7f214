"""The encoder benchmark (pipeline/methods/bench.py): throughput rows carry the median speedup and its spread
(the timer's own specification is tests/test_timer.py), and a floor model gives each pruned model its Amdahl
estimate."""

from __future__ import annotations

import copy

import pytest
import torch

from pipeline.core.flops import forward_flops
from pipeline.core.sites import attention_sites, ffn_sites
from pipeline.core.surgery import prune_heads
from pipeline.core.timer import SPEEDUP_SPREAD
from pipeline.methods.bench import (
    amdahl_speedup,
    floor_model,
    measure_throughput,
    random_encoder,
    random_inputs,
)


def test_throughput_rows_carry_the_median_speedup_and_its_spread_with_the_reference_at_exactly_one():
    models = {f: random_encoder("tiny", "sdpa") for f in (0.0, 0.5)}
    batches = [random_inputs(models[0.0], batch_size, 8) for batch_size in (2, 3)]
    rows = measure_throughput(models, batches, repeats=7)
    assert [(r["batch_size"], r["fraction_pruned"]) for r in rows] == [(2, 0.0), (2, 0.5), (3, 0.0), (3, 0.5)]
    # Each batch's ratios pair its own reference's calls: against itself, every round's ratio is exactly one.
    for reference in (rows[0], rows[2]):
        assert [reference[key] for key in SPEEDUP_SPREAD] == [1.0] * 5
    # The two models are the same shape, so each batch's FLOP ideal is exactly one.
    assert all(r["examples_per_s"] > 0 and r["ideal_speedup"] == 1.0 for r in rows)


def test_the_floor_model_keeps_one_head_and_one_neuron_in_every_layer_and_leaves_the_model_alone():
    model = random_encoder("tiny", "sdpa")
    floor = floor_model(model)
    assert [s.num_heads for s in attention_sites(floor)] == [1, 1]
    assert [len(s.kept_neurons) for s in ffn_sites(floor)] == [1, 1]
    assert [s.num_heads for s in attention_sites(model)] == [12, 12]
    inputs = random_inputs(model, 2, 16)
    with torch.inference_mode():
        assert floor(**inputs).logits.shape == model(**inputs).logits.shape


def test_the_amdahl_estimate_is_the_flop_ideal_without_fixed_work_and_one_when_all_work_is_fixed():
    assert amdahl_speedup(floor_share=0.0, ideal=2.0, floor_ideal=float("inf")) == pytest.approx(2.0)
    assert amdahl_speedup(floor_share=1.0, ideal=2.0, floor_ideal=10.0) == pytest.approx(1.0)
    # 2 of 10 s fixed in a floor of a tenth of the FLOPs; the other 8 s shrink with the FLOPs above it (90 -> 40).
    assert amdahl_speedup(0.2, ideal=2.0, floor_ideal=10.0) == pytest.approx(10 / (2 + 8 * 40 / 90))


def test_throughput_rows_with_a_floor_carry_its_share_and_each_models_amdahl_estimate_and_no_row_of_its_own():
    full = random_encoder("tiny", "sdpa")
    pruned = prune_heads(copy.deepcopy(full), {0: range(6), 1: range(6)})
    floor = floor_model(full)
    rows = measure_throughput({0.0: full, 0.5: pruned}, [random_inputs(full, b, 16) for b in (1, 2)], repeats=3,
                              floor=floor)
    assert [(r["batch_size"], r["fraction_pruned"]) for r in rows] == [(1, 0.0), (1, 0.5), (2, 0.0), (2, 0.5)]
    probe = {k: v[:1] for k, v in random_inputs(full, 1, 16).items()}
    flops = {name: forward_flops(m, probe) for name, m in (("full", full), ("pruned", pruned), ("floor", floor))}
    for r in rows:
        assert 0 < r["floor_share"] == rows[0 if r["batch_size"] == 1 else 2]["floor_share"]
        ideal = flops["full"] / flops["pruned" if r["fraction_pruned"] else "full"]
        assert r["ideal_speedup"] == pytest.approx(ideal)
        floor_ideal = flops["full"] / flops["floor"]
        assert r["amdahl_speedup"] == pytest.approx(amdahl_speedup(r["floor_share"], ideal, floor_ideal))
    # The reference's estimate is exactly one: it is the model the floor's share is of.
    assert rows[0]["amdahl_speedup"] == pytest.approx(1.0) and rows[2]["amdahl_speedup"] == pytest.approx(1.0)
