"""The width probe on its own: the multiple of FFN neurons this device's matrix kernels run well, to pin as
`prune.budgeted.width_multiple` so that the pruned widths do not depend on one run's timings
(pipeline/methods/widths.py says how it is measured).

    python -m pipeline.studies.widths --device cuda --precision bf16
    python -m pipeline.studies.widths --shape bert-base --tokens 128 512 --rounds 5
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from pipeline.core.runtime import RuntimeUnavailable, resolve_runtime
from pipeline.files.schema import PRECISIONS
from pipeline.methods.bench import SHAPES
from pipeline.methods.widths import probe_width_multiple


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="minilm-l6", choices=[s for s in SHAPES if s != "tiny"])
    parser.add_argument("--tokens", nargs="+", type=int, default=[128, 512, 2048, 8192],
                        help="tokens per FFN call: the benchmark's batch sizes times its sequence length")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of every width, after a warm-up")
    args = parser.parse_args(argv)
    if min(args.tokens) < 1 or args.rounds < 1:
        parser.error(f"--tokens and --rounds must be at least 1, got {args.tokens} and {args.rounds}")
    try:
        runtime = resolve_runtime(args.device, args.precision)
    except RuntimeUnavailable as error:
        parser.error(str(error).replace("runtime.device", "--device").replace("runtime.precision", "--precision"))
    shape = SHAPES[args.shape]
    with runtime.autocast():
        probe = probe_width_multiple(shape["hidden_size"], shape["intermediate_size"], args.tokens, runtime.device)
    print(f"{args.shape} FFN ({shape['hidden_size']} -> {shape['intermediate_size']}) on {runtime.device_name}, "
          f"{args.precision}, tokens {args.tokens}: efficiency (FLOP share of the full FFN's time / time taken)")
    for multiple, efficiency in probe.efficiency.items():
        print(f"  multiple {multiple:>3}: {efficiency:.3f}{'  <- chosen' if multiple == probe.multiple else ''}")
    print(f"prune.budgeted.width_multiple: {probe.multiple}")


if __name__ == "__main__":
    main()
