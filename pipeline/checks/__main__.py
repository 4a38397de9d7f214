"""`python -m pipeline.checks [--params FILE]`: check an experiment before running it (`make repro` does, first).

The params, the model folder or hub id and its family, the data files, their columns, labels and split sizes: every
problem is listed, one line each, within about two seconds, with nothing written. The prepare stage runs the same
checks (pipeline/run/preflight.py) before it loads anything heavy.
"""

from __future__ import annotations

from pipeline.run.preflight import check_all, params_file


def main(argv: list[str] | None = None) -> None:
    path = params_file(argv, description="Check the params, model and data of the experiment in FILE.")
    problems = check_all(path)
    if problems:
        raise SystemExit("\n".join(f"error: {problem}" for problem in problems))
    print(f"ok: {path}: params, model and data checked")


if __name__ == "__main__":
    main()
