"""The real DVC pipeline, end to end, on a tiny configuration: `dvc repro` of this repo's dvc.yaml and
stage code on a tiny BERT and a small local CSV, then the DVC behaviours users rely on."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import datasets
import pandas as pd
import pytest
import yaml

from tests.tiny_project import (
    STAGES,
    ran_stages,
    run,
    undeclared_params,
)

pytestmark = pytest.mark.slow  # runs `dvc repro` of the tiny pipeline


@pytest.fixture(scope="module")
def trace_dir(tiny_trace_dir) -> Path:
    return tiny_trace_dir


@pytest.fixture(scope="module")
def repo(tiny_reproduced) -> Path:
    return tiny_reproduced[0]  # reproduced once by conftest.py, shared with tests/test_killed_runs.py


def test_every_stage_declares_the_params_it_reads(repo, trace_dir):
    assert sorted(p.stem for p in trace_dir.glob("*.json")) == sorted(STAGES)
    assert undeclared_params(repo, "dvc.yaml", trace_dir) == {}


def test_repro_writes_every_table_figure_and_report(repo):
    reports = repo / "reports" / "tiny"
    expected_columns = {
        "importance.csv": ["kind", "layer", "head", "importance", "precision"],  # the stage has no metrics file
        "ablation.csv": ["kind", "layer", "head", "metric", "delta", "p_value"],
        "one_head.csv": ["kind", "layer", "best_head", "metric", "delta"],
        "pruning_curve.csv": ["method", "split", "fraction_pruned", "heads_pruned", "metric"],
        "recovery.csv": ["fraction_pruned", "metric_before", "metric_after", "precision"],
        "benchmark.csv": ["fraction_pruned", "batch_size", "attn_implementation", "examples_per_s", "speedup",
                          "speedup_q1", "speedup_q3", "speedup_min", "speedup_max", "ideal_speedup", "floor_share",
                          "amdahl_speedup", "params", "device", "precision"],
        "budgeted_curve.csv": ["method", "split", "budget_removed", "fraction_flops_removed", "heads_pruned",
                               "neurons_pruned", "metric", "examples", "collapsed"],
        "budgeted_layers.csv": ["method", "budget_removed", "unit", "kind", "layer", "kept", "of"],
        "benchmark_budgeted.csv": ["budget_removed", "batch_size", "attn_implementation", "speedup",
                                   "speedup_q1", "speedup_q3", "speedup_min", "speedup_max", "ideal_speedup",
                                   "floor_share", "amdahl_speedup", "device", "precision"],
    }
    for name, columns in expected_columns.items():
        table = pd.read_csv(reports / name)
        assert set(columns) <= set(table.columns), name
        assert len(table) > 0
    for name in ("finetune.json", "ablate.json", "prune.json", "benchmark.json"):  # what the runtime ran at
        assert json.loads((reports / name).read_text())["precision"] == "fp32", name
    curve = pd.read_csv(reports / "pruning_curve.csv")
    assert set(curve.method) == {"importance", "reestimated", "random"} and set(curve.split) == {"dev", "test"}
    assert sorted(curve.fraction_pruned.unique()) == [0.0, 0.25, 0.5, 0.75]
    ablation = pd.read_csv(reports / "ablation.csv")
    assert len(ablation) == 8 and set(ablation.examples) == {12}
    splits = datasets.load_from_disk(str(repo / "artifacts" / "tiny" / "data"))
    sizes = curve.groupby("split").examples.unique().map(list).to_dict()
    assert sizes == {s: [len(splits[s])] for s in ("dev", "test")}
    html = (reports / "report.html").read_text()
    assert "<img" in html and not re.search(r"(src|href)=\"https?://", html)
    assert (repo / "artifacts" / "tiny" / "pruned" / "50" / "head_pruning.json").exists()


def test_budgeted_methods_meet_their_flop_budgets_and_reach_the_benchmark_and_report(repo):
    reports = repo / "reports" / "tiny"
    budgeted = pd.read_csv(reports / "budgeted_curve.csv")
    assert set(budgeted.method) == {"paper", "budgeted-heads", "budgeted", "budgeted-tuned"}
    # Every method at every level it reaches costs at most its budget; the joint methods reach every level.
    assert (budgeted.fraction_flops_removed >= budgeted.budget_removed - 1e-9).all()
    joint = budgeted[budgeted.method.isin(["budgeted", "budgeted-tuned"])]
    assert sorted(joint.budget_removed.unique()) == [0.0, 0.2, 0.4]
    assert (joint[joint.budget_removed > 0].neurons_pruned > 0).all()
    record = (repo / "artifacts" / "tiny" / "pruned" / "budgeted-40" / "head_pruning.json").read_text()
    assert '"ffn_sites"' in record
    bench = pd.read_csv(reports / "benchmark_budgeted.csv")
    assert sorted(bench.budget_removed.unique()) == [0.0, 0.4]
    # Rounded to the multiple and as searched without it, side by side in one run, beside unpruned.
    widths = set(zip(bench.budget_removed, bench.widths, strict=True))
    assert widths == {(0.0, "full"), (0.4, "rounded"), (0.4, "as searched")}
    assert (repo / "artifacts" / "tiny" / "pruned" / "budgeted-40-unrounded").is_dir()
    seconds = pd.read_csv(reports / "prune_seconds.csv")
    assert seconds[(seconds.part == "whole_prune") & (seconds.level == 0.4)].seconds.iloc[0] > 0
    summary = json.loads((reports / "budgeted.json").read_text())
    assert summary["widths"]["multiple"] == 4 and "test@0.4" in summary["widths"]["unrounded"]
    report = (reports / "report.md").read_text()
    assert "Beyond the paper: heads and FFN neurons under a FLOPs budget" in report
    assert "Kwon et al. (2022), reported" in report
    assert "(figures/budgeted_layers.png)" in report
    layers = pd.read_csv(reports / "budgeted_layers.csv")
    kept = layers[(layers.method == "budgeted-tuned") & (layers.budget_removed == 0.4)]
    neurons = kept[kept.unit == "neurons"]
    assert ((neurons.kept % 4 == 0) | (neurons.kept == neurons["of"])).all()
    assert neurons.kept.sum() == neurons["of"].sum() - budgeted[
        (budgeted.method == "budgeted-tuned") & (budgeted.budget_removed == 0.4)].neurons_pruned.iloc[0]


def test_the_calibration_sample_is_held_out_from_the_fisher_sample(repo, monkeypatch):
    from pipeline.run.experiment import Experiment

    monkeypatch.chdir(repo)
    exp = Experiment.from_params_file("params.yaml")

    def examples(batches) -> list[tuple]:
        return [tuple(row[mask.bool()].tolist()) + (int(label),) for b in batches
                for row, mask, label in zip(b["input_ids"], b["attention_mask"], b["labels"], strict=True)]

    fisher, held_out = examples(exp.task.sample_batches(64)), examples(exp.task.sample_batches(256, skip=64))
    train = len(exp.split("train"))
    assert 64 < train < 64 + 256  # the tiny project: the held-out sample is the rest of train
    assert len(fisher) == 64 and len(held_out) == train - 64
    assert sorted(fisher + held_out) == sorted(examples(exp.task.sample_batches(None)))  # together: all of train, once
    # The held-out sample continues the same seeded order: the first 16 after the Fisher sample's 64.
    first_80 = Counter(examples(exp.task.sample_batches(80)))
    assert Counter(examples(exp.task.sample_batches(16, skip=64))) == first_80 - Counter(fisher)


def test_second_repro_is_a_no_op(repo):
    assert ran_stages(run(["dvc", "repro"], repo)) == []
    assert "up to date" in run(["dvc", "status"], repo).lower()


def test_rescoring_gives_byte_identical_importance(repo):
    before = (repo / "reports" / "tiny" / "importance.csv").read_bytes()
    run(["dvc", "repro", "-f", "-s", "score"], repo)
    assert (repo / "reports" / "tiny" / "importance.csv").read_bytes() == before


def test_a_prune_param_reruns_only_prune_and_what_follows(repo):
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["prune"]["step"] = 0.5
    # The latency budget too: a per-layer latency table measured here, then the same budgeted methods.
    params["prune"]["budgeted"].update(budget="latency", latency={"batch_size": 2, "seq_len": 16, "repeats": 1})
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    ran = ran_stages(run(["dvc", "repro"], repo))
    # The pruned models at save_fractions are unchanged, so DVC may rightly skip recover and benchmark.
    assert ran[0] == "prune" and ran[-1] == "report" and set(ran) <= {"prune", "recover", "benchmark", "report"}
    curve = pd.read_csv(repo / "reports" / "tiny" / "pruning_curve.csv")
    assert sorted(curve.fraction_pruned.unique()) == [0.0, 0.5]
    budgeted_run = json.loads((repo / "reports" / "tiny" / "budgeted.json").read_text())
    latency = pd.DataFrame(budgeted_run["latency_table"])
    assert set(latency.units) == {"heads", "neurons"} and (latency.seconds > 0).all()
    # A tiny model's latency is mostly fixed overhead, so levels it cannot reach are left out, not faked.
    budgeted = pd.read_csv(repo / "reports" / "tiny" / "budgeted_curve.csv")
    assert set(budgeted.method) >= {"paper", "budgeted"} and 0.0 in set(budgeted.budget_removed)


def test_experiments_and_diffs_across_commits(repo):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    run([*git, "add", "-A"], repo)
    run([*git, "commit", "-qm", "baseline"], repo)
    run(["dvc", "exp", "run", "-S", "prune.step=0.25", "-n", "finer"], repo)
    assert "finer" in run(["dvc", "exp", "list", "--name-only"], repo)
    # The experiment beside the baseline, as a reader compares them: its changed param and its headline metrics.
    shown = run(["dvc", "exp", "show", "--only-changed", "--no-pager", "--md"], repo)
    assert "finer" in shown and "prune.step" in shown and "failed to load" not in shown
    run(["dvc", "exp", "apply", "finer"], repo)
    assert "prune.step" in run(["dvc", "params", "diff"], repo)
    run(["dvc", "metrics", "diff"], repo)
    run(["dvc", "plots", "diff", "-o", "plots_out"], repo)
    page = (repo / "plots_out" / "index.html").read_text()
    assert "vega" in page and not re.search(r"<script[^>]*src=", page)
    run([*git, "add", "-A"], repo)
    run([*git, "commit", "-qm", "finer"], repo)


def test_a_fresh_clone_reads_metrics_and_plots_from_git_alone(repo, tmp_path):
    """No DVC cache and no remote: the numbers a reader compares travel with the commits that made them."""
    if "finer" not in run(["git", "log", "--format=%s"], repo):
        pytest.skip("needs the two commits of test_experiments_and_diffs_across_commits")
    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(repo), str(clone)], tmp_path)
    assert not (clone / ".dvc" / "cache").exists()
    shown = run(["dvc", "metrics", "show"], clone)
    assert "failed" not in shown.lower() and "finetune.json" in shown and "prune.json" in shown
    diff = json.loads(run(["dvc", "metrics", "diff", "HEAD~1", "--all", "--json"], clone))
    prune = diff["reports/tiny/prune.json"]
    assert {"old", "new"} <= set(prune["test.unpruned"]) and prune["test.unpruned"]["old"] is not None
    plots = json.loads(run(["dvc", "plots", "diff", "HEAD~1", "--json"], clone))
    assert not plots.get("errors")
    curve = plots["data"]["reports/tiny/pruning_curve.csv"]
    assert {"HEAD~1", "workspace"} <= {rev for plot in curve for rev in plot["revisions"]}
    for table in ("ablation.csv", "one_head.csv", "importance.csv", "recovery.csv", "benchmark.csv"):
        assert f"reports/tiny/{table}" in plots["data"]


def test_invalid_params_stop_the_stage_before_it_writes_anything(repo):
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["prune"]["stepp"] = 0.1
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    stamp = (repo / "reports" / "tiny" / "pruning_curve.csv").stat().st_mtime_ns
    result = subprocess.run([sys.executable, "-m", "stages.prune"], cwd=repo, capture_output=True, text=True)
    assert result.returncode != 0
    assert "prune.stepp: unknown key; allowed here: step, max_fraction" in result.stderr
    assert (repo / "reports" / "tiny" / "pruning_curve.csv").stat().st_mtime_ns == stamp
