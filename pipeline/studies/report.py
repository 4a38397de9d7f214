"""The experiment report rendered by hand, from the tables the stages wrote to a report folder (the report stage
renders it the same way, `pipeline.report.build.build_report`):

    python -m pipeline.studies.report <report_dir> [--title "..."]

Prints the path of report.html. Nothing here imports torch or transformers.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.report.build import build_report


def main() -> None:
    parser = argparse.ArgumentParser(description="Render report.md / report.html from experiment outputs.")
    parser.add_argument("report_dir", type=Path)
    parser.add_argument("--title", help="default: after the model and data that finetune.json names")
    args = parser.parse_args()
    print(build_report(args.report_dir, args.title))


if __name__ == "__main__":
    main()
