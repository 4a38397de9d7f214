"""Regenerate the offline HTML template of `dvc plots show` / `dvc plots diff` (pipeline/report/plots_template.py
says what it holds and how DVC is wired to it). Needs `npm` for `npm pack`, or tarballs already downloaded into
--tarballs DIR:

    python -m pipeline.studies.plots_template [--out reports/plots_template.html] [--tarballs DIR]

Every tarball is checked against the npm `integrity` (sha512) recorded in PACKAGES before use. Nothing here imports
matplotlib.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.report import plots_template


def main() -> None:
    parser = argparse.ArgumentParser(description=plots_template.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=plots_template.DEFAULT_OUT)
    parser.add_argument("--tarballs", type=Path, default=None, help="directory with already packed .tgz files")
    args = parser.parse_args()
    out = plots_template.write_template(args.out, args.tarballs)
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
