"""Stage report: report.md and a self-contained report.html with figures, beside the paper's findings."""

from __future__ import annotations

from pipeline.run.preflight import preflight

if __name__ == "__main__":  # the params in a second or two, before the imports below load torch
    preflight("report")

from pipeline.report.build import build_report
from pipeline.run.experiment import Experiment, log


def main() -> None:
    exp = Experiment.from_cli()
    task = exp.task()
    path = build_report(exp.reports, title=f"Head pruning: {task['model']} on {task['data']}")
    log.info("report: %s", path)


if __name__ == "__main__":
    main()
