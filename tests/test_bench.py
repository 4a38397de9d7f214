"""The benchmark's timer (pipeline/methods/bench.py): models take turns within each round, and a speedup is the
median of the rounds' paired ratios, with its interquartile range."""

from __future__ import annotations

import pytest

from pipeline.methods.bench import (
    SPEEDUP_SPREAD,
    interleaved_times,
    measure_throughput,
    random_encoder,
    random_inputs,
    ratio_columns,
    speedup_ratio,
    spread_times,
)


def test_interleaved_times_warm_each_up_then_take_turns_starting_one_later_each_round():
    calls = []
    seconds = interleaved_times({key: (lambda key=key: calls.append(key)) for key in "abc"}, rounds=4)
    assert calls == list("abc") + list("abc") + list("bca") + list("cab") + list("abc")
    assert {key: len(s) for key, s in seconds.items()} == {"a": 4, "b": 4, "c": 4}


def test_spread_times_give_every_group_a_turn_each_round_so_its_rounds_span_the_whole_run():
    calls = []
    groups = {g: {key: (lambda g=g, key=key: calls.append(g + key)) for key in "ab"} for g in "XY"}
    seconds = spread_times(groups, rounds=3)
    warm_up = ["Xa", "Xb", "Ya", "Yb"]
    # Round 0: X then Y, each model in turn; round 1 starts one later in both; round 2 as round 0.
    assert calls == warm_up + ["Xa", "Xb", "Ya", "Yb"] + ["Yb", "Ya", "Xb", "Xa"] + ["Xa", "Xb", "Ya", "Yb"]
    assert {g: {key: len(s) for key, s in times.items()} for g, times in seconds.items()} == {
        "X": {"a": 3, "b": 3}, "Y": {"a": 3, "b": 3}}


def test_a_speedup_pairs_the_calls_of_each_round_so_drift_across_rounds_cancels():
    # The machine slows down fourfold over the run; within each round the model is twice as fast.
    drift = [1.0, 1.5, 2.0, 3.0, 4.0, 4.0, 2.0]
    reference, pruned = [d * 0.2 for d in drift], [d * 0.1 for d in drift]
    ratio = speedup_ratio(reference, pruned)
    assert ratio.median == pytest.approx(2.0) and ratio.q1 == pytest.approx(2.0) and ratio.q3 == pytest.approx(2.0)
    # A burst of load on one call of one round moves neither the median nor the quartiles; the range holds it.
    one_slow_call = speedup_ratio(reference, [*pruned[:-1], pruned[-1] * 4])
    assert (one_slow_call.q1, one_slow_call.median, one_slow_call.q3) == pytest.approx((2.0, 2.0, 2.0))
    assert (one_slow_call.min, one_slow_call.max) == pytest.approx((0.5, 2.0))


def test_the_interquartile_range_and_the_range_bracket_the_median_of_the_rounds_ratios():
    ratio = speedup_ratio([1.0] * 8, [1 / r for r in (1.3, 1.0, 1.7, 1.2, 1.4, 1.1, 1.6, 1.5)])
    assert ratio.q1 == pytest.approx(1.175) and ratio.median == pytest.approx(1.35)
    assert ratio.q3 == pytest.approx(1.525)
    assert (ratio.min, ratio.max) == pytest.approx((1.0, 1.7))
    assert ratio_columns(ratio) == pytest.approx(
        {"speedup": 1.35, "speedup_q1": 1.175, "speedup_q3": 1.525, "speedup_min": 1.0, "speedup_max": 1.7})


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
