"""Stage report: report.md and a self-contained report.html with figures, beside the paper's findings.

It reads only the tables in reports/<experiment>/ (its deps), and imports neither torch nor transformers.
"""

from __future__ import annotations

from pipeline.run.preflight import preflight

if __name__ == "__main__":  # the params in a second or two, before the imports below
    preflight("report")

import sys

from pipeline.config.params import load_params
from pipeline.config.tasks import family_module
from pipeline.config.trace import traced
from pipeline.files.artifacts import artifact_excepthook
from pipeline.report.build import build_report
from pipeline.run.preflight import params_file


def main(argv: list[str] | None = None) -> None:
    path = params_file(argv)
    sys.excepthook = artifact_excepthook(path)  # a damaged table: one line naming the stage to rerun
    params = traced(load_params(path), "report")
    own = family_module(params.task, "report")  # the family's sections beyond the shared ones, where it has some
    print(f"report: {build_report(params.report_dir, family_sections=own.SECTIONS if own else ())}")


if __name__ == "__main__":
    main()
