"""The experiment report rendered by hand, from the tables the stages wrote to a report folder (the report stage
renders it the same way, `pipeline.report.build.build_report`):

    python -m pipeline.studies.report <report_dir> [--task TASK] [--title "..."]

Prints the path of report.html. Nothing here imports torch or transformers.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.config.tasks import TASK_PACKAGES, family_module
from pipeline.files.schema import CLASSIFICATION
from pipeline.report.build import build_report


def main() -> None:
    parser = argparse.ArgumentParser(description="Render report.md / report.html from experiment outputs.")
    parser.add_argument("report_dir", type=Path)
    parser.add_argument("--title", help="default: after the model and data that finetune.json names")
    parser.add_argument("--task", choices=list(TASK_PACKAGES), default=CLASSIFICATION,
                        help="the experiment's task, whose family may add sections of its own")
    args = parser.parse_args()
    own = family_module(args.task, "report")
    print(build_report(args.report_dir, args.title, family_sections=own.SECTIONS if own else ()))


if __name__ == "__main__":
    main()
