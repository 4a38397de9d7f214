"""The MT experiment end to end on a tiny configuration: `dvc repro mt/dvc.yaml` with this repo's stage
code on a few hundred generated sentence pairs and a tiny Marian trained from scratch: training with
checkpoints, BLEU, ablation per attention kind, scoring, pruning with generate() after pruning (by kind
and per checkpoint), decoding speed and the report."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.tiny_project import (
    MT_COLUMNS,
    make_pipeline_repo,
    ran_stages,
    run,
    tiny_mt_params,
    traced_env,
    undeclared_params,
    write_pairs,
)

pytestmark = pytest.mark.slow  # runs `dvc repro mt/dvc.yaml`


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("params-trace")


@pytest.fixture(scope="module")
def repo(tmp_path_factory, trace_dir) -> Path:
    root = make_pipeline_repo(tmp_path_factory.mktemp("mt_repo"), "mt", tiny_mt_params())
    write_pairs(root / "pairs.tsv")
    first = run(["dvc", "repro", "mt/dvc.yaml"], root, traced_env(trace_dir))
    assert [s.removeprefix("mt/dvc.yaml:") for s in ran_stages(first)] == [
        "prepare", "finetune", "ablate", "score", "prune", "benchmark", "report"]
    return root


def test_every_stage_declares_the_params_it_reads(repo, trace_dir):
    stages = yaml.safe_load((repo / "mt/dvc.yaml").read_text())["stages"]
    assert len(list(trace_dir.glob("*.json"))) == len(stages)
    assert undeclared_params(repo, "mt/dvc.yaml", trace_dir) == {}


def test_training_saves_checkpoints_and_scores_bleu_with_its_signature(repo):
    steps = sorted(p.name for p in (repo / "artifacts" / "tiny-mt" / "checkpoints").iterdir())
    assert steps == ["step-000010", "step-000020", "step-000040"]
    finetune = json.loads((repo / "reports" / "tiny-mt" / "finetune.json").read_text())
    about = json.loads((repo / "reports" / "tiny-mt" / "about.json").read_text())
    assert about["metric"] == "bleu" and 0 <= finetune["test"] <= 100
    assert about["bleu_signature"].startswith("nrefs:1")
    loss = pd.read_csv(repo / "reports" / "tiny-mt" / "training_loss.csv")
    assert len(loss) == 40 and loss.loss.iloc[-5:].mean() < loss.loss.iloc[:5].mean()


def test_tables_cover_the_three_attention_kinds(repo):
    reports = repo / "reports" / "tiny-mt"
    ablation = pd.read_csv(reports / "ablation.csv")
    assert set(ablation.kind) == {"encoder", "decoder", "cross"} and len(ablation) == 3 * 2 * 4
    assert ablation.p_value.between(0, 1).all() and set(ablation.examples) == {20}
    assert len(pd.read_csv(reports / "one_head.csv")) == 6
    assert set(pd.read_csv(reports / "importance.csv").kind) == {"encoder", "decoder", "cross"}


def test_pruning_curves_by_kind_random_and_per_checkpoint(repo):
    reports = repo / "reports" / "tiny-mt"
    curve = pd.read_csv(reports / "pruning_curve.csv")
    assert set(curve.method) == {"importance", "random", "importance-encoder", "importance-decoder",
                                 "importance-cross", "checkpoint-10", "checkpoint-20", "checkpoint-40"}
    assert set(curve.split) == {"test"}
    cross = curve[curve.method == "importance-cross"].sort_values("fraction_pruned")
    assert cross.fraction_pruned.tolist() == [0.0, 0.25, 0.5, 0.75] and cross.heads_pruned.tolist() == [0, 2, 4, 6]
    correlation = pd.read_csv(reports / "rank_correlation.csv").set_index("step").spearman
    assert set(correlation.index) == {10, 20, 40} and correlation[40] == pytest.approx(1.0)
    record = json.loads((repo / "artifacts" / "tiny-mt" / "pruned" / "50" / "head_pruning.json").read_text())
    assert sum(site["original_num_heads"] - len(site["kept_heads"]) for site in record["sites"]) == 12


def test_decoding_speed_and_the_report(repo):
    reports = repo / "reports" / "tiny-mt"
    bench = pd.read_csv(reports / "benchmark.csv")
    assert {"examples_per_s", "tokens_per_s", "speedup", "ideal_speedup", "params"} <= set(bench.columns)
    assert sorted(bench.fraction_pruned.unique()) == [0.0, 0.25, 0.5] and (bench.ideal_speedup[
        bench.fraction_pruned > 0] > 1).all()
    html = (reports / "report.html").read_text()
    assert "BLEU" in html and "<img" in html and not re.search(r"(src|href)=\"https?://", html)
    md = (reports / "report.md").read_text()
    assert "cross-attention" in md and "Spearman" in md


def test_second_repro_is_a_no_op(repo):
    assert ran_stages(run(["dvc", "repro", "mt/dvc.yaml"], repo)) == []


def test_a_pretrained_model_is_evaluated_not_trained(repo, tmp_path):
    """The hub path (e.g. Helsinki-NLP/opus-mt-en-fr) with a local folder in the same format: the model
    trained above. prepare copies it with its tokenizer, finetune skips training, and BLEU is unchanged."""
    clone = tmp_path / "pretrained"
    for name in ("pipeline", "stages", "mt", "pairs.tsv"):
        copy = shutil.copytree if (repo / name).is_dir() else shutil.copy
        copy(repo / name, clone / name)
    params = tiny_mt_params()
    params["model"]["name_or_path"] = str(repo / "artifacts" / "tiny-mt" / "finetuned")
    (clone / "mt" / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(["git", "init", "-q"], clone)
    run(["dvc", "init", "-q"], clone)
    run(["dvc", "repro", "mt/dvc.yaml:finetune"], clone)
    ours = json.loads((clone / "reports" / "tiny-mt" / "finetune.json").read_text())
    trained = json.loads((repo / "reports" / "tiny-mt" / "finetune.json").read_text())
    assert ours["train_steps"] == 0 and (ours["dev"], ours["test"]) == (trained["dev"], trained["test"])
    assert [p.name for p in (clone / "artifacts" / "tiny-mt" / "checkpoints").iterdir()] == ["step-000000"]


def test_the_tables_have_the_mt_columns(repo):
    """The fairseq backend writes the same columns (tests/test_fairseq_e2e.py)."""
    for name, columns in MT_COLUMNS.items():
        assert pd.read_csv(repo / "reports" / "tiny-mt" / name).columns.tolist() == columns, name
