"""Stage benchmark: the paper's Table 4 on this experiment's physically pruned models, measured by the family's
`benchmark` (pipeline/tasks/<family>/benchmark.py): classification's examples/s beside the ideal FLOP speedup (and
the budgeted-tuned models'), translation's decoding speed, a language model's prefill and cached-decode tokens/s
beside the ideals from FLOPs and KV bytes.

Models run on the runtime's device (`runtime.device`). Every model is timed at each precision of
`benchmark.precisions` (and at `runtime.precision`, if not among them; `auto` as this machine resolves it), under
autocast; each row names its device and precision, and a speedup compares models at the same precision, batch size
and attention implementation.
On a GPU the timer synchronises the device around each repeat and peak memory is CUDA's allocator peak.
"""

from __future__ import annotations

from pipeline.run.preflight import preflight

if __name__ == "__main__":  # the params in a second or two, before the imports below load torch
    preflight("benchmark")

from pipeline.core.runtime import Runtime, RuntimeUnavailable, resolve_precision, resolve_runtime
from pipeline.files.atomic import write_csv, write_json
from pipeline.files.schema import BENCHMARK_SUMMARY
from pipeline.run.experiment import Experiment


def runtimes(exp: Experiment) -> list[Runtime]:
    """The runtime's device at each precision the benchmark times: `benchmark.precisions`, then
    `runtime.precision` if it is not among them (one line, naming the key, when this machine cannot run one)."""
    device = exp.runtime.device
    try:  # `auto` resolved first, so that [auto, bf16] on a native-bf16 machine times bf16 once
        precisions = list(dict.fromkeys(resolve_precision(p, device)
                                        for p in [*exp.params.benchmark.precisions, exp.runtime.precision]))
        return [resolve_runtime(str(device), p) for p in precisions]
    except RuntimeUnavailable as error:
        raise SystemExit(f"error: benchmark.precisions: {error}") from None


def main(argv: list[str] | None = None) -> None:
    exp = Experiment.from_cli(argv)
    tables, summary = exp.task.stage("benchmark").benchmark(exp, runtimes(exp))
    for name, table in tables.items():
        write_csv(exp.reports / name, table)
    write_json(exp.reports / BENCHMARK_SUMMARY, exp.metrics(summary))


if __name__ == "__main__":
    main()
