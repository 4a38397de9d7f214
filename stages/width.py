"""Stage width (language models): query heads, key/value groups and MLP channels pruned together under one budget,
with no retraining, by every method of `width.methods` (the peers' reimplementations, the paper's importance, and
the project's own), each with and without each compensation of `width.compensations`, side by side on the same
calibration windows, at every level of `width.levels` (pipeline/methods/width/, the family's `width`).

Writes width_curve.csv (a row per model and evaluation corpus: perplexity, the share of parameters it really lost,
its KV-cache bytes per token), width.json (the headline: at the level nearest 20%, the project's method and the best
peer on test, beside the unpruned model) and the project's method saved at `width.save_levels` (stock folders, for
the recover, zero_shot and benchmark stages).
"""

from __future__ import annotations

from pipeline.run.preflight import preflight

if __name__ == "__main__":  # the params in a second or two, before the imports below load torch
    preflight("width")

from pipeline.files.atomic import write_csv, write_json
from pipeline.files.schema import WIDTH_SUMMARY, WIDTH_TABLE
from pipeline.run.experiment import Experiment, log


def main(argv: list[str] | None = None) -> None:
    exp = Experiment.from_cli(argv)
    with exp.runtime.autocast():
        table, summary, models = exp.task.stage("width").width(exp)
    for level, model in models.items():
        exp.save(model, exp.width_dir(level))
        log.info("width: %s holds the project's method at %.0f%% of the %s removed", exp.width_dir(level),
                 100 * level, exp.params.width.budget)
    write_csv(exp.reports / WIDTH_TABLE, table)
    write_json(exp.reports / WIDTH_SUMMARY, exp.metrics(summary))


if __name__ == "__main__":
    main()
