"""One command that checks this project on a CUDA GPU (`make gpu-check`), in at most ~8 minutes, offline:

    python -m pipeline.checks.gpu                      # both parts, on cuda at fp32 and bf16
    python -m pipeline.checks.gpu --parts benchmark    # only the Table-4 benchmark
    python -m pipeline.checks.gpu --parts llm          # only the LLM scoring beside the memory plan
    python -m pipeline.checks.gpu --device cpu --tiny  # the same code at a tiny shape, in seconds (tests)

1. repro: `dvc repro` of a tiny offline project (pipeline/checks/tiny_project.py: a random 2-layer BERT, 160
   local sentences) in a temporary folder, with `runtime.device: cuda` and `runtime.precision: bf16`, so every
   stage runs its models on the GPU under autocast; the benchmark stage times fp32 and bf16.
2. benchmark: the paper's Table 4 at BERT-base shape with random weights (12 layers x 12 heads; 0, 30, 50 and
   70% of the heads physically pruned, evenly per layer; batch 1 to 256; seq 128; sdpa), at fp32 and at bf16,
   printed as one table: examples/s, measured speedup, the ideal speedup from FLOPs, their ratio, peak memory
   (CUDA's allocator), device and precision. Speedups compare models at the same precision and batch.
3. llm: the SmolLM2 default scored whole in bf16, then a 1B-class Llama (random weights) scored layer by layer,
   each with its seconds and CUDA's peak memory beside the memory plan's estimate (pipeline/checks/gpu_llm.py).

Without a CUDA GPU it refuses in one line (exit status 2) unless told `--device cpu`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import torch

from pipeline.checks.gpu_llm import score_runs
from pipeline.checks.tiny_project import make_tiny_project, run_tool, tiny_params
from pipeline.core.runtime import RuntimeUnavailable, resolve_runtime
from pipeline.files.schema import BENCHMARK_TABLE, DEFAULT
from pipeline.methods.bench import throughput_table

PARTS = ["repro", "benchmark", "llm"]
FRACTIONS = [0.0, 0.3, 0.5, 0.7]
PRECISIONS = ["fp32", "bf16"]
FULL = dict(shape="bert-base", batch_sizes=[1, 4, 16, 64, 128, 256], seq_len=128, repeats=7)
TINY = dict(shape="tiny", batch_sizes=[1, 2], seq_len=16, repeats=1)
COLUMNS = {  # the printed table's columns, from throughput_table's
    "batch_size": "batch", "fraction_pruned": "heads pruned", "precision": "precision",
    "examples_per_s": "examples/s", "speedup": "speedup", "ideal_speedup": "ideal (FLOPs)",
    "of_ideal": "speedup/ideal", "peak_memory_mb": "peak MiB", "device": "device",
}


def benchmark_table(device: str = "cuda", tiny: bool = False, precisions: Sequence[str] = PRECISIONS,
                    attn_implementation: str = "sdpa") -> pd.DataFrame:
    """Table 4 on random weights: one row per precision, batch size and share of heads pruned (the
    columns of COLUMNS, named as printed)."""
    size = TINY if tiny else FULL
    runtimes = [resolve_runtime(device, p) for p in precisions]
    table = throughput_table([size["shape"]], FRACTIONS, size["batch_sizes"], [attn_implementation],
                             size["seq_len"], size["repeats"], runtimes, memory=True)
    table["of_ideal"] = table["speedup"] / table["ideal_speedup"]
    table = table.sort_values(["precision", "batch_size", "fraction_pruned"], key=_precision_first)
    return table[list(COLUMNS)].rename(columns=COLUMNS).reset_index(drop=True)


def _precision_first(column: pd.Series) -> pd.Series:
    return column.map(PRECISIONS.index) if column.name == "precision" else column


def format_table(table: pd.DataFrame) -> str:
    shown = table.copy()
    shown["heads pruned"] = shown["heads pruned"].map(lambda f: f"{f:.0%}")
    return shown.to_string(index=False, float_format=lambda v: f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}")


def tiny_repro(device: str, precision: str = "bf16", keep: Path | None = None) -> str:
    """`dvc repro` of the tiny offline project on `device` at `precision` (hub off); one line on what its
    benchmark stage measured."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        root = Path(keep or tmp) / "tiny-project"
        root.mkdir(parents=True)
        params = tiny_params()
        params["runtime"] = {"device": device, "precision": precision}
        params["benchmark"]["precisions"] = list(dict.fromkeys(["fp32", precision]))
        make_tiny_project(root, params)
        run_tool(["dvc", "repro", "-q"], root, {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
        reports = root / "reports" / params["experiment"]
        bench = pd.read_csv(reports / BENCHMARK_TABLE)
        if not (reports / "report.html").is_file():
            raise RuntimeError(f"no report.html in {reports}")
        return (f"every stage ran; benchmark.csv: {len(bench)} rows on {', '.join(map(str, bench.device.unique()))} "
                f"at {', '.join(bench.precision.unique())}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (default: cuda)")
    parser.add_argument("--tiny", action="store_true", help="a tiny model and batches 1, 2 (a CPU test's size)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=PARTS)
    parser.add_argument("--model", default=DEFAULT, help="the llm part's SmolLM2 folder (default: the pinned wheel's)")
    parser.add_argument("--csv", default=None, help="also write the benchmark table here")
    args = parser.parse_args(argv)
    try:
        for precision in PRECISIONS:
            resolve_runtime(args.device, precision)
    except RuntimeUnavailable as error:
        print(f"gpu-check: {error}", file=sys.stderr)
        return 2
    name = resolve_runtime(args.device).device_name
    print(f"gpu-check on {name}: torch {torch.__version__}, CUDA {torch.version.cuda}", flush=True)
    if "repro" in args.parts:
        start = time.perf_counter()
        print(f"\n1. dvc repro of the tiny project, runtime.device {args.device}, runtime.precision bf16", flush=True)
        try:
            print(f"repro: {tiny_repro(args.device)}", flush=True)
        except RuntimeError as error:
            print(f"gpu-check: the tiny project's dvc repro failed: {error}", file=sys.stderr)
            return 1
        print(f"repro: ok in {time.perf_counter() - start:.0f} s", flush=True)
    if "benchmark" in args.parts:
        start = time.perf_counter()
        size = TINY if args.tiny else FULL
        print(f"\n2. Table 4 at {size['shape']} shape, random weights, seq {size['seq_len']}, sdpa, "
              f"median of {size['repeats']}", flush=True)
        table = benchmark_table(args.device, tiny=args.tiny)
        if args.csv:
            table.to_csv(args.csv, index=False)
        print("\n" + format_table(table), flush=True)
        print(f"benchmark: ok in {time.perf_counter() - start:.0f} s", flush=True)
    if "llm" in args.parts:
        start = time.perf_counter()
        print("\n3. LLM scoring (llm/params.yaml's score settings, random token ids) beside the memory plan",
              flush=True)
        for run in score_runs(args.device, tiny=args.tiny, model=args.model):
            print(run.line(), flush=True)
        print(f"llm: ok in {time.perf_counter() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
