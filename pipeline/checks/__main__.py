"""`python -m pipeline.checks [--params FILE] [--devices 8x80GiB] [--tflops N]`: check an experiment before running it
(`make repro` does, first).

The params, the model folder or hub id and its family, the data files, their columns, labels and split sizes: every
problem is listed, one line each, within about two seconds, with nothing written. The prepare stage runs the same
checks (pipeline/run/preflight.py) before it loads anything heavy.

For a language-modelling experiment it then prints the memory plan (pipeline/checks/placement_plan.py): each stage's
peak memory estimated from the model's config, the placement that fits the devices here (or those of `--devices`,
to plan a cluster from a laptop) and the hours scoring and pruning take. A model folder with a config.json and no
weights can be planned but not run: the checks say "plan only" instead of "ok", and prepare refuses it.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from pipeline.checks.memory_plan import DecoderShape
from pipeline.checks.placement_plan import DevicesError, local_devices, parse_devices, plan_lines
from pipeline.checks.plan_config import PlanUnavailable, config_only_folder, model_config, plan_model_type
from pipeline.checks.width_plan import width_problems
from pipeline.config.params import load_params
from pipeline.files.schema import LANGUAGE_MODELING
from pipeline.run.preflight import check_all

if TYPE_CHECKING:
    from pipeline.tasks.language_modeling.params import LanguageModelingParams


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Check the params, model and data of the experiment in FILE, and "
                                                 "print a language model's memory plan.")
    parser.add_argument("--params", default="params.yaml", metavar="FILE",
                        help="the experiment's params file (default: params.yaml)")
    parser.add_argument("--devices", metavar="NxSIZE", help="plan for these GPUs instead of this machine's, e.g. "
                                                             "8x80GiB or 2x80GiB,2x40GiB")
    parser.add_argument("--tflops", type=float, metavar="N", help="assumed throughput of a device for the time "
                                                                  "estimate, in TFLOP/s (default: see the plan)")
    return parser.parse_args(argv)


def weightless_problem(line: str, folder: str) -> bool:
    """A problem that only says the config-only `folder` has no weights or tokenizer (pipeline/data/inputs.py's
    lines): what a folder made for planning lacks by design."""
    return folder in line and ("but no weights" in line or "has no tokenizer" in line)


def width_plan_problems(params: LanguageModelingParams) -> list[str]:
    """The width stage's levels and compensations against the model's config, where it is known before prepare."""
    try:
        config, _ = model_config(params)
    except PlanUnavailable:
        return []
    return width_problems(params, config, plan_model_type(params, config))


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)
    try:
        planned = parse_devices(args.devices) if args.devices else None
    except DevicesError as error:
        raise SystemExit(f"error: {error}") from None
    problems = check_all(args.params)
    params = None if problems and not any("no weights" in p for p in problems) else load_params(args.params)
    folder = config_only_folder(params) if params is not None and params.task == LANGUAGE_MODELING else None
    if folder is not None:
        problems = [p for p in problems if not weightless_problem(p, str(folder))]
    if not problems and params is not None and params.task == LANGUAGE_MODELING:
        problems = width_plan_problems(params)
    if problems:
        raise SystemExit("\n".join(f"error: {problem}" for problem in problems))
    if folder is not None:
        print(f"plan only: {args.params}: {folder} has a config.json but no weights, so it can be planned, not run "
              f"(prepare refuses it)")
    else:
        print(f"ok: {args.params}: params, model and data checked")
    if params is None or params.task != LANGUAGE_MODELING:
        return
    try:
        config, source = model_config(params)
        shape = DecoderShape.from_config(config)
    except PlanUnavailable as error:
        print(f"memory plan: not made: {error}")
        return
    except (KeyError, TypeError, ValueError) as error:
        print(f"memory plan: not made: the model's config lacks or garbles {error}")
        return
    devices = planned or local_devices(params.runtime.device)
    print("\n".join(plan_lines(shape, params, source, devices, planned is not None, args.tflops)))


if __name__ == "__main__":
    main()
