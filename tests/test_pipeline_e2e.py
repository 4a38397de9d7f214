"""The real DVC pipeline, end to end, on a tiny configuration: `dvc repro` of this repo's dvc.yaml and
stage code on a tiny BERT and a small local CSV, then the DVC behaviours users rely on."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import pytest
import transformers
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORDS = "good great fine fun superb moving bad awful dull boring weak poor the a film movie plot cast is was".split()


def run(cmd: list[str], cwd: Path) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "DVC_NO_ANALYTICS": "1", "TQDM_DISABLE": "1"}
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def ran_stages(output: str) -> list[str]:
    return re.findall(r"Running stage '([^']+)'", output)


def tiny_params() -> dict:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["experiment"] = "tiny"
    params["model"]["name_or_path"] = "tiny_model"
    params["data"].update(source="data.csv", max_length=16)
    params["finetune"].update(epochs=1, batch_size=16)
    params["eval"]["batch_size"] = 32
    params["ablate"].update(n_resamples=100, max_examples=12)  # of 16 test examples
    params["score"].update(max_examples=32, batch_size=16)
    params["prune"].update(step=0.25, max_fraction=0.75, save_fractions=[0.25, 0.5], max_examples=None)
    params["recover"].update(steps=2, batch_size=8)
    params["benchmark"].update(batch_sizes=[1, 2], seq_len=16, repeats=1)
    return params


def write_tiny_assets(root: Path) -> None:
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
    tokenizer = transformers.BertTokenizerFast(vocab=vocab)
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=24, max_position_embeddings=32, num_labels=2)
    transformers.BertForSequenceClassification(config).save_pretrained(root / "tiny_model")
    tokenizer.save_pretrained(root / "tiny_model")
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(160):
        label = int(rng.integers(0, 2))
        cue = rng.choice(WORDS[:6] if label else WORDS[6:12], size=2)
        rows.append({"text": " ".join([*rng.choice(WORDS[12:], size=3), *cue]), "label": label})
    pd.DataFrame(rows).to_csv(root / "data.csv", index=False)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    for package in ("pipeline", "stages"):
        shutil.copytree(ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "dvc.yaml", root / "dvc.yaml")
    (root / "params.yaml").write_text(yaml.safe_dump(tiny_params(), sort_keys=False))
    write_tiny_assets(root)
    run(["git", "init", "-q"], root)
    run(["dvc", "init", "-q"], root)
    shutil.copy(ROOT / ".dvc" / "config", root / ".dvc" / "config")  # analytics off, the offline plots template
    (root / "reports").mkdir()
    shutil.copy(ROOT / "reports" / "plots_template.html", root / "reports" / "plots_template.html")
    first = run(["dvc", "repro"], root)
    assert ran_stages(first) == ["prepare", "finetune", "ablate", "score", "prune", "recover", "benchmark", "report"]
    return root


def test_repro_writes_every_table_figure_and_report(repo):
    reports = repo / "reports" / "tiny"
    expected_columns = {
        "importance.csv": ["kind", "layer", "head", "importance"],
        "ablation.csv": ["kind", "layer", "head", "metric", "delta", "p_value"],
        "one_head.csv": ["kind", "layer", "best_head", "metric", "delta"],
        "pruning_curve.csv": ["method", "split", "fraction_pruned", "heads_pruned", "metric"],
        "recovery.csv": ["fraction_pruned", "metric_before", "metric_after"],
        "benchmark.csv": ["fraction_pruned", "batch_size", "attn_implementation", "examples_per_s", "speedup",
                          "ideal_speedup", "params"],
    }
    for name, columns in expected_columns.items():
        table = pd.read_csv(reports / name)
        assert set(columns) <= set(table.columns), name
        assert len(table) > 0
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
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    ran = ran_stages(run(["dvc", "repro"], repo))
    # The pruned models at save_fractions are unchanged, so DVC may rightly skip recover and benchmark.
    assert ran[0] == "prune" and ran[-1] == "report" and set(ran) <= {"prune", "recover", "benchmark", "report"}
    curve = pd.read_csv(repo / "reports" / "tiny" / "pruning_curve.csv")
    assert sorted(curve.fraction_pruned.unique()) == [0.0, 0.5]


def test_experiments_and_diffs_across_commits(repo):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    run([*git, "add", "-A"], repo)
    run([*git, "commit", "-qm", "baseline"], repo)
    run(["dvc", "exp", "run", "-S", "prune.step=0.25", "-n", "finer"], repo)
    assert "finer" in run(["dvc", "exp", "list", "--name-only"], repo)
    run(["dvc", "exp", "apply", "finer"], repo)
    assert "prune.step" in run(["dvc", "params", "diff"], repo)
    run(["dvc", "metrics", "diff"], repo)
    run(["dvc", "plots", "diff", "-o", "plots_out"], repo)
    page = (repo / "plots_out" / "index.html").read_text()
    assert "vega" in page and not re.search(r"<script[^>]*src=", page)


def test_invalid_params_stop_the_stage_before_it_writes_anything(repo):
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["prune"]["stepp"] = 0.1
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    stamp = (repo / "reports" / "tiny" / "pruning_curve.csv").stat().st_mtime_ns
    result = subprocess.run([sys.executable, "-m", "stages.prune"], cwd=repo, capture_output=True, text=True)
    assert result.returncode != 0
    assert "prune.stepp: unknown key; allowed here: step, max_fraction" in result.stderr
    assert (repo / "reports" / "tiny" / "pruning_curve.csv").stat().st_mtime_ns == stamp
