"""The benchmarks' timer (pipeline/core/timer.py): callables take turns within each round, each called back to
back for its turn, and a speedup is the median of the rounds' paired ratios, with its interquartile range and its
range."""

from __future__ import annotations

import os

import pytest
import torch

from pipeline.core import timer
from pipeline.core.timer import (
    MAX_CALLS_PER_TURN,
    calls_per_turn,
    interleaved_times,
    peak_allocated_mib,
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


class FakeClock:
    """perf_counter for functions that take a set time: calling one advances the clock by its seconds."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def taking(self, seconds: float, calls: list, name: str):
        def fn() -> None:
            calls.append(name)
            self.now += seconds
        return fn


def test_a_turn_calls_each_cheap_function_back_to_back_until_the_turn_is_filled_and_keeps_their_median(monkeypatch):
    clock, calls = FakeClock(), []
    monkeypatch.setattr(timer.time, "perf_counter", clock)
    fns = {"a": clock.taking(0.04, calls, "a"), "b": clock.taking(0.02, calls, "b")}
    seconds = spread_times({"X": fns}, rounds=2, turn_seconds=0.1)
    # Warm-up once, then once more since both are cheaper than a turn; the slower fills it in ceil(0.1 / 0.04) calls.
    assert calls[:4] == ["a", "b", "a", "b"]
    # Each function's calls run back to back; the next round starts with b.
    assert calls[4:10] == ["a"] * 3 + ["b"] * 3 and calls[10:] == ["b"] * 3 + ["a"] * 3
    assert seconds == {"X": {"a": [pytest.approx(0.04)] * 2, "b": [pytest.approx(0.02)] * 2}}


def test_a_model_is_timed_warm_so_the_slowdown_after_another_models_call_does_not_count(monkeypatch):
    # Each function runs five times slower when the call before it was the other one's (its weights evicted from
    # the caches): only the first call of a turn pays it, and the turn's median leaves it out.
    clock, calls = FakeClock(), []
    monkeypatch.setattr(timer.time, "perf_counter", clock)

    def model(name: str):
        def fn() -> None:
            clock.now += 0.01 if calls and calls[-1] == name else 0.05
            calls.append(name)
        return fn

    seconds = spread_times({"X": {"a": model("a"), "b": model("b")}}, rounds=3, turn_seconds=0.2)
    assert seconds == {"X": {"a": [pytest.approx(0.01)] * 3, "b": [pytest.approx(0.01)] * 3}}


def test_a_turn_keeps_one_call_of_a_function_slower_than_the_turn_and_caps_the_calls_of_instant_ones():
    assert calls_per_turn(0.5, turn_seconds=0.2) == 1
    assert calls_per_turn(0.05, turn_seconds=0.0) == 1
    assert calls_per_turn(0.05, turn_seconds=0.2) == 4
    assert calls_per_turn(0.0, turn_seconds=0.2) == MAX_CALLS_PER_TURN


def test_the_median_of_a_turn_leaves_out_its_one_slow_call(monkeypatch):
    clock, calls = FakeClock(), []
    monkeypatch.setattr(timer.time, "perf_counter", clock)
    durations = iter([0.01] * 2 + [0.05] + [0.01] * 20)  # the first timed call runs five times slower

    def fn() -> None:
        calls.append("a")
        clock.now += next(durations)

    seconds = interleaved_times({"a": fn}, rounds=1, turn_seconds=0.05)
    assert len(calls) == 2 + 5 and seconds == {"a": [pytest.approx(0.01)]}


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


def test_peak_memory_is_measured_without_the_profilers_lines_and_keeps_the_rest_of_stderr(capfd):
    def allocate() -> torch.Tensor:
        os.write(2, b"a line of the model's own\n")
        return torch.ones(256, 1024)  # 1 MiB of float32

    assert peak_allocated_mib(allocate) == pytest.approx(1.0)
    err = capfd.readouterr().err
    assert "a line of the model's own" in err
    assert not any(line.startswith(("USDT:", "STAGE:")) for line in err.splitlines()), err
