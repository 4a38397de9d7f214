"""The MT budget study (pipeline/studies/mt_budget.py) on a tiny prepared experiment: each run's BLEU by step, put on
the minutes axis by its shape's measured step time; the finetune stage's checkpoints as a run of their own; and the
one-line refusals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from pipeline.checks.tiny_project import tool_env
from pipeline.studies.mt_budget import main
from tests.tiny_project import tiny_mt_params, write_pairs

pytestmark = pytest.mark.slow  # prepares and trains tiny Marian models

ROOT = Path(__file__).resolve().parents[1]


def stage(name: str, cwd: Path) -> None:
    result = subprocess.run([sys.executable, "-m", f"stages.{name}", "--params", "mt.yaml"], cwd=cwd,
                            env=tool_env({"PYTHONPATH": str(ROOT)}), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def experiment(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mt_budget")
    write_pairs(root / "pairs.tsv")
    (root / "mt.yaml").write_text(yaml.safe_dump(tiny_mt_params(), sort_keys=False))
    stage("prepare", root)
    return root


def study(*args: str) -> None:
    main([*args, "--params", "mt.yaml", "--out", "study"])


def test_each_run_is_scored_by_step_and_drawn_on_its_shapes_minutes(experiment, monkeypatch):
    monkeypatch.chdir(experiment)
    study("time", "--d-model", "32", "--ffn-dim", "64", "--steps", "3", "--warmup", "1")
    for lr in ("1e-3", "3e-3"):
        study("train", "--d-model", "32", "--ffn-dim", "64", "--learning-rate", lr, "--steps", "12",
              "--eval-steps", "6", "12")
    study("plot")
    table = pd.read_csv("study/mt_budget.csv")
    timing = pd.read_csv("study/step_seconds.csv")
    assert sorted(table["run"].unique()) == ["d32-ffn64-lr0.001-tok512", "d32-ffn64-lr0.003-tok512"]
    assert table.groupby("run")["step"].apply(list).tolist() == [[6, 12], [6, 12]]
    # Test BLEU at every step, dev only at the last (the one that chooses).
    assert table["test_bleu"].notna().all()
    assert table.groupby("run")["dev_bleu"].apply(lambda dev: dev.notna().tolist()).tolist() == [[False, True]] * 2
    seconds = timing.loc[timing["shape"] == "d32-ffn64", "seconds_per_step"].item()
    assert table["minutes"].tolist() == pytest.approx((table["step"] * seconds / 60).round(2).tolist())
    assert Path("study/mt_budget.png").read_bytes().startswith(b"\x89PNG")


def test_the_finetune_stages_checkpoints_are_a_run_of_their_own(experiment, monkeypatch):
    monkeypatch.chdir(experiment)
    stage("finetune", experiment)
    study("checkpoints")
    rows = pd.read_csv("study/runs/d32-ffn64-lr0.002-tok512-stage.csv")
    assert rows["step"].tolist() == [10, 20, 40]  # finetune.checkpoint_steps and the last step
    assert rows["dev_bleu"].notna().tolist() == [False, False, True]


def test_a_schedule_that_depends_on_the_step_count_is_refused_in_one_line(experiment, monkeypatch, tmp_path):
    monkeypatch.chdir(experiment)
    params = tiny_mt_params()
    params["finetune"]["schedule"] = "linear"
    Path("linear.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    with pytest.raises(SystemExit, match="^error: finetune.schedule is 'linear'; .* needs inverse_sqrt"):
        main(["train", "--params", "linear.yaml", "--out", str(tmp_path), "--steps", "2"])


def test_a_plot_without_step_times_names_the_command_to_run(experiment, monkeypatch, tmp_path):
    monkeypatch.chdir(experiment)
    with pytest.raises(SystemExit, match="^error: no runs in .*; run `python -m pipeline.studies.mt_budget train`"):
        main(["plot", "--params", "mt.yaml", "--out", str(tmp_path)])
    (tmp_path / "runs").mkdir()
    pd.DataFrame([{"run": "r", "shape": "d8-ffn8", "max_tokens": 64, "step": 1, "test_bleu": 1.0}]).to_csv(
        tmp_path / "runs" / "r.csv", index=False)
    with pytest.raises(SystemExit, match=r"^error: no .*step_seconds.csv; run `python -m pipeline.studies.mt_budget"):
        main(["plot", "--params", "mt.yaml", "--out", str(tmp_path)])
