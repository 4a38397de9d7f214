"""Stage recover: fine-tune the physically pruned models briefly and measure what comes back (the family's `recover`:
classification fine-tunes on train; language models use LoRA or full fine-tuning on their training objective,
perplexity on test, the recovered models saved)."""

from __future__ import annotations

from pipeline.run.preflight import preflight

if __name__ == "__main__":  # the params in a second or two, before the imports below load torch
    preflight("recover")

from pipeline.core.runtime import is_main_process
from pipeline.files.atomic import write_csv
from pipeline.files.schema import RECOVERY_TABLE
from pipeline.run.experiment import Experiment


def main(argv: list[str] | None = None) -> None:
    exp = Experiment.from_cli(argv)
    table = exp.task.stage("recover").recover(exp)
    if is_main_process():  # under `accelerate launch` every process computes the same table; one writes it
        write_csv(exp.reports / RECOVERY_TABLE, exp.stamped(table))


if __name__ == "__main__":
    main()
