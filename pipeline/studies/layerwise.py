"""Whole-model against layer-by-layer head importance on an experiment's own model and scoring data: the score stage's
computation (`Task.head_importance`) under runtime.placement whole and layerwise, each in a fresh process so that its
peak RSS is its own, at each precision asked; then how far the scores differ, their Spearman rank correlation, and
whether the heads pruned at each level of the prune stage (prune.unit, prune.step to prune.max_fraction) are the same.

    python -m pipeline.studies.layerwise --params llm/params.yaml                  # fp32 and bf16
    python -m pipeline.studies.layerwise --params llm/params.yaml --precisions bf16

Run where the experiment's artifacts are (its prepared model folder and data); it writes nothing there.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml
from scipy.stats import spearmanr

from pipeline.config.params import parse_params
from pipeline.core.checkpoint import model_skeleton
from pipeline.core.importance import HeadChoice
from pipeline.core.sites import attention_sites
from pipeline.core.timer import peak_rss_bytes
from pipeline.files.schema import LAYERWISE, PRECISIONS, WHOLE
from pipeline.methods.pruning import heads_for, pruning_levels
from pipeline.run.experiment import Experiment


def experiment(params_file: str, placement: str, precision: str) -> Experiment:
    raw = yaml.safe_load(Path(params_file).read_text())
    raw.setdefault("runtime", {}).update(placement=placement, precision=precision)
    return Experiment(parse_params(raw))


def score(params_file: str, placement: str, precision: str, out: Path) -> None:
    """One placement's scores, seconds and peak RSS into `out` (the child process's work)."""
    exp = experiment(params_file, placement, precision)
    batches = exp.task.score_batches()
    start = time.perf_counter()
    sites, raw = exp.task.head_importance(exp.finetuned_dir, batches)
    seconds = time.perf_counter() - start
    torch.save({"scores": raw, "seconds": seconds, "peak_rss": peak_rss_bytes(),
                "sites": [(s.kind, s.layer) for s in sites]}, out)


def compare(params_file: str, precision: str, folder: Path) -> dict:
    """Both placements at `precision`, each in a child process, and how their scores and pruning choices differ."""
    runs = {}
    for placement in (WHOLE, LAYERWISE):
        out = folder / f"{placement}-{precision}.pt"
        subprocess.run([sys.executable, "-m", "pipeline.studies.layerwise", "--params", params_file, "--child",
                        placement, precision, str(out)], check=True)
        runs[placement] = torch.load(out)
    whole, layerwise = runs[WHOLE]["scores"], runs[LAYERWISE]["scores"]
    flat_whole, flat_layerwise = torch.cat(whole), torch.cat(layerwise)
    exp = experiment(params_file, WHOLE, precision)
    pp = exp.params.prune
    sites = attention_sites(model_skeleton(exp.finetuned_dir))  # the shapes and groups, without the weights
    choice = HeadChoice(pp.unit, pp.uniform, pp.min_heads_per_layer)
    total = sum(site.num_heads for site in sites)
    same = {}
    for level in pruning_levels(pp.step, pp.max_fraction):
        count = heads_for(level, total)
        same[level] = (choice.select(choice.rank(whole, sites), sites, count)
                       == choice.select(choice.rank(layerwise, sites), sites, count))
    return {
        "precision": precision,
        "max_relative_difference": float(((flat_layerwise - flat_whole).abs() / flat_whole.abs().max()).max()),
        "spearman": float(spearmanr(flat_whole, flat_layerwise).statistic),
        "identical": bool(torch.equal(flat_whole, flat_layerwise)),
        "same_heads_pruned": same,
        **{f"{p}_seconds": runs[p]["seconds"] for p in runs},
        **{f"{p}_peak_rss_mib": runs[p]["peak_rss"] / 2**20 for p in runs},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default="llm/params.yaml")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=PRECISIONS)
    parser.add_argument("--child", nargs=3, metavar=("PLACEMENT", "PRECISION", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        placement, precision, out = args.child
        score(args.params, placement, precision, Path(out))
        return
    with tempfile.TemporaryDirectory() as folder:
        for precision in args.precisions:
            print(yaml.safe_dump(compare(args.params, precision, Path(folder)), sort_keys=False), flush=True)


if __name__ == "__main__":
    main()
