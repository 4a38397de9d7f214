"""The timer of every benchmark: callables timed in turns, round by round, and speedups as paired ratios.

`spread_times` gives each group of callables (the models one ratio compares) a turn every round, and within it
each callable a turn of its own: called back to back until `turn_seconds` are filled, the round keeping the
median. Groups and callables start one later each round, so the figures a ratio pairs are a moment apart and each
group's rounds span the whole measurement. `speedup_ratio` reads a speedup from two callables' seconds in the same
rounds (the median of the rounds' ratios, their interquartile range and their range: `Ratio`), and
`ratio_columns` writes it as a benchmark row's columns. The range of n rounds is a distribution-free confidence
interval for the median ratio (it misses the median with probability 2 / 2**n: 98% at 7 rounds), so two runs whose
ranges do not overlap differ by more than the machine's noise. `peak_allocated_mib` measures one call's peak memory;
`peak_rss_bytes` reads the process's own high-water mark of resident memory.

Nothing here knows about models: the benchmarks (pipeline/methods/bench.py, pipeline/methods/llm_bench.py), the
latency budget (pipeline/methods/budgeted_costs.py) and the width probe (pipeline/methods/widths.py) hand it
callables.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pipeline.core.runtime import CPU_FP32, Runtime

# A turn's calls of one function stop here even when `turn_seconds` asks for more (calls of microseconds).
MAX_CALLS_PER_TURN = 50


def spread_times(groups: Mapping[Hashable, Mapping[Hashable, Callable[[], object]]], rounds: int,
                 runtime: Runtime = CPU_FP32, turn_seconds: float = 0.0
                 ) -> dict[Hashable, dict[Hashable, list[float]]]:
    """The seconds of each function of each group, one figure per round for `rounds` rounds, under the runtime's
    autocast, after a warm-up. A group is what one ratio compares (the models, at one batch size). Every round gives
    each group a turn, and within it each of the group's functions a turn of its own: `calls_per_turn` calls back
    to back, of which the round keeps the median. Both the groups and the functions within a group's turn start one
    later each round (A B C, B C A, ...).

    So the figures a ratio pairs are a fraction of a second apart, and load from elsewhere on a shared machine,
    which comes and goes over seconds, falls on both alike. Back to back, a model is timed as it runs when it
    serves one batch after another (and as the paper's Table 4 timed it, over a data set): warm, with as much of
    its own weights in the caches as they hold. The first call of its turn, after another function's, is the one
    the median leaves out. (Alternating single calls of the models instead timed every call just after another
    model's: at batch 1 on the 2-core CPU that put the floor model at 16% of the unpruned model's time against 13-14%
    back to back, and cost the 40% budgeted model 1-5% of its speedup, a cost no model pays in use.) Each group's
    rounds are spread over the whole measurement, not bunched into the few seconds that its own calls take: their
    spread then holds the drift of the machine over the run's minutes, which is what a second run of the same
    measurement meets. With `turn_seconds` 0 every function is called once a turn.

    CUDA runs asynchronously: the device is synchronised before each timer starts and before it stops, so a
    call is timed from an idle GPU to the end of its own kernels (on the CPU synchronising is a no-op).
    """
    # A caller that passes no runtime (the budgeted latency table) may still time CUDA models: synchronise then too.
    sync = runtime.synchronize if runtime.is_cuda or not torch.cuda.is_initialized() else torch.cuda.synchronize

    def timed(fn: Callable[[], object]) -> float:
        sync()
        start = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - start

    names = list(groups)
    times = {name: {key: [] for key in groups[name]} for name in names}
    calls = {}
    with runtime.autocast():
        for name, fns in groups.items():
            # warm-up: allocator, kernel selection (oneDNN primitives per shape; cuBLAS heuristics)
            seconds = [timed(fn) for fn in fns.values()]
            if turn_seconds > 0 and max(seconds) < turn_seconds:  # cheap calls: time them warm to size the turn
                seconds = [timed(fn) for fn in fns.values()]
            calls[name] = calls_per_turn(max(seconds), turn_seconds)
        for round_ in range(rounds):
            for name in _turns(names, round_):
                fns = groups[name]
                for key in _turns(list(fns), round_):
                    times[name][key].append(statistics.median([timed(fns[key]) for _ in range(calls[name])]))
    return times


def calls_per_turn(seconds: float, turn_seconds: float) -> int:
    """How many calls of `seconds` each fill a turn of `turn_seconds` (at least one, at most
    `MAX_CALLS_PER_TURN`)."""
    if turn_seconds <= 0 or seconds >= turn_seconds:
        return 1
    return min(MAX_CALLS_PER_TURN, math.ceil(turn_seconds / max(seconds, 1e-9)))


def _turns(keys: list, round_: int) -> list:
    """`keys` in turn, starting one later each round."""
    return keys[round_ % len(keys):] + keys[:round_ % len(keys)]


def interleaved_times(fns: Mapping[Hashable, Callable[[], object]], rounds: int,
                      runtime: Runtime = CPU_FP32, turn_seconds: float = 0.0) -> dict[Hashable, list[float]]:
    """`spread_times` of one group: the seconds of each of `fns`, one figure per round, taking turns."""
    return spread_times({None: fns}, rounds, runtime, turn_seconds)[None]


def median_times(fns: Mapping[Hashable, Callable[[], object]], rounds: int,
                 runtime: Runtime = CPU_FP32, turn_seconds: float = 0.0) -> dict[Hashable, float]:
    """The median of each one's `interleaved_times`."""
    return {key: statistics.median(seconds)
            for key, seconds in interleaved_times(fns, rounds, runtime, turn_seconds).items()}


@dataclass(frozen=True)
class Ratio:
    """A speedup measured round by round: the median of the rounds' ratios, their interquartile range (how the
    rounds spread) and their range (the confidence interval for the median that two runs are compared by)."""

    median: float
    q1: float
    q3: float
    min: float
    max: float


def speedup_ratio(reference: Sequence[float], seconds: Sequence[float]) -> Ratio:
    """How many times faster than `reference` a model ran, from the two's seconds in the same rounds: each
    round's ratio pairs two calls made a moment apart, so drift between rounds cancels out of it."""
    ratios = np.asarray(reference, dtype=float) / np.asarray(seconds, dtype=float)
    low, q1, median, q3, high = np.quantile(ratios, [0.0, 0.25, 0.5, 0.75, 1.0])
    return Ratio(float(median), float(q1), float(q3), float(low), float(high))


# The speedup columns `ratio_columns` writes, in order.
SPEEDUP_SPREAD = ("speedup", "speedup_q1", "speedup_q3", "speedup_min", "speedup_max")


def ratio_columns(ratio: Ratio, prefix: str = "speedup") -> dict[str, float]:
    """The speedup columns of a benchmark row: the median ratio, its interquartile range and its range over the
    rounds."""
    return {prefix: ratio.median, f"{prefix}_q1": ratio.q1, f"{prefix}_q3": ratio.q3,
            f"{prefix}_min": ratio.min, f"{prefix}_max": ratio.max}


def peak_allocated_mib(fn: Callable[[], object], runtime: Runtime = CPU_FP32) -> float:
    """The peak of memory allocated during one call of `fn` under the runtime's autocast, above what was allocated
    before it, in MiB.

    On a GPU it is `torch.cuda.max_memory_allocated` during the call, less what was allocated before it. On the CPU
    the profiler records every allocation and free of torch's CPU allocator in order; summing them gives the live
    bytes over time. Unlike the process's resident set (~500 MiB of framework, and allocator noise between runs),
    this is exact and the same on every run.
    """
    if runtime.is_cuda:
        with runtime.autocast(), runtime.peak_memory() as memory:
            fn()
        return memory["peak_mib"]
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with _without_profiler_lines(), runtime.autocast(), torch.profiler.profile(activities=cpu,
                                                                                profile_memory=True) as prof:
        fn()
    live = peak = 0
    allocations = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    for event in sorted(allocations, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak / 2**20


# What the profiler's C++ side (Kineto) writes to file descriptor 2 at every start and stop, whatever its log level
# (KINETO_LOG_LEVEL silences the rest, not these): "USDT:<time> <pid>:<tid> SyncActivityProfilerHandler.cpp:52]
# profiler_start", and "STAGE:..." lines.
PROFILER_LINE_PREFIXES = ("USDT:", "STAGE:")


@contextlib.contextmanager
def _without_profiler_lines() -> Iterator[None]:
    """Runs the block with the process's stderr (fd 2, where C++ writes) caught in a file, then writes back every
    line but the profiler's own: a stage's output says what the stage did, not that a profiler started."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = [line for line in caught.read().decode(errors="replace").splitlines(keepends=True)
                    if not line.startswith(PROFILER_LINE_PREFIXES)]
            sys.stderr.write("".join(kept))


def peak_rss_bytes(reset: bool = False) -> int:
    """This process's peak resident memory in bytes (Linux's VmHWM), or, with `reset`, its resident memory now,
    which the peak restarts from (a later call reads the peak since).

    Not `ru_maxrss`: a child started by fork and exec inherits its parent's high-water mark there, so a child of a
    1.2 GB pytest process reported 988 MiB for a peak of 490 MiB.
    """
    if reset:
        Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak RSS to the current RSS (Linux 4.0+)
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
