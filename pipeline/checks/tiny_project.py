"""A tiny, offline copy of this project: its stage code and dvc.yaml, a tiny random BERT and a small local CSV
in the GLUE schema, in a fresh git + DVC repository. The end-to-end tests (tests/tiny_project.py) and
`make gpu-check` (pipeline/checks/gpu.py) reproduce it with `dvc repro`; nothing in it reads the hub.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import transformers
import yaml

ROOT = Path(__file__).resolve().parents[2]  # this repository: pipeline/run/ -> the root
WORDS = "good great fine fun superb moving bad awful dull boring weak poor the a film movie plot cast is was".split()


def tool_env(extra_env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of git and dvc runs: this interpreter's bin first (its dvc), no analytics, no bars."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "DVC_NO_ANALYTICS": "1", "TQDM_DISABLE": "1", **(extra_env or {})}


def run_tool(cmd: list[str], cwd: Path, extra_env: dict[str, str] | None = None) -> str:
    """Run `cmd` in `cwd`; its output, or RuntimeError with the output when it fails."""
    result = subprocess.run(cmd, cwd=cwd, env=tool_env(extra_env), capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout + result.stderr


def tiny_params(root: Path = ROOT) -> dict:
    """The params of `root`'s params.yaml, shrunk so that every stage runs in seconds on the tiny model."""
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["experiment"] = "tiny"
    params["model"]["name_or_path"] = "tiny_model"
    params["data"].update(source="data.csv", max_length=16)
    params["finetune"].update(epochs=1, batch_size=16)
    params["eval"]["batch_size"] = 32
    params["ablate"].update(n_resamples=100, max_examples=12)  # of 16 test examples
    params["score"].update(max_examples=32, batch_size=16)
    params["prune"].update(step=0.25, max_fraction=0.75, save_fractions=[0.25, 0.5], max_examples=None)
    # Off here: the projects of the flow tests exercise DVC and Prefect, not the method; test_pipeline_e2e turns
    # it on (with_budgeted) for the pipeline's own repository.
    params["prune"]["budgeted"].update(methods=[], save_levels=[])
    params["recover"].update(steps=2, batch_size=8)
    params["benchmark"].update(batch_sizes=[1, 2], seq_len=16, repeats=1, turn_seconds=0)
    return params


def write_tiny_assets(root: Path) -> None:
    """`root`/tiny_model (a random 2-layer, 4-head BERT with its tokenizer) and `root`/data.csv (160 sentences)."""
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
    tokenizer = transformers.BertTokenizerFast(vocab=vocab)
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=24, max_position_embeddings=32, num_labels=2)
    # Seeded, and without touching the caller's random state: every tiny project starts from the same weights, so
    # two of them reproduce to the same bytes (tests/test_killed_runs.py compares a killed run with another's).
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = transformers.BertForSequenceClassification(config)
    model.save_pretrained(root / "tiny_model")
    tokenizer.save_pretrained(root / "tiny_model")
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(160):
        label = int(rng.integers(0, 2))
        cue = rng.choice(WORDS[:6] if label else WORDS[6:12], size=2)
        rows.append({"text": " ".join([*rng.choice(WORDS[12:], size=3), *cue]), "label": label})
    pd.DataFrame(rows).to_csv(root / "data.csv", index=False)


def make_tiny_project(root: Path, params: dict | None = None, extra_files: tuple[str, ...] = (),
                      source: Path = ROOT) -> Path:
    """A git + DVC repository at `root` with the code of `source` and `params` (default: the tiny params);
    nothing reproduced yet."""
    for package in ("pipeline", "stages"):
        shutil.copytree(source / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("dvc.yaml", ".gitignore", ".dvcignore", *extra_files):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source / name, root / name)
    (root / "params.yaml").write_text(yaml.safe_dump(params or tiny_params(source), sort_keys=False))
    write_tiny_assets(root)
    run_tool(["git", "init", "-q"], root)
    run_tool(["dvc", "init", "-q", "-f"], root)
    shutil.copy(source / ".dvc" / "config", root / ".dvc" / "config")  # analytics off, the offline plots template
    shutil.copytree(source / ".dvc" / "plots", root / ".dvc" / "plots")  # the tables' plot templates
    (root / "reports").mkdir()
    shutil.copy(source / "reports" / "plots_template.html", root / "reports" / "plots_template.html")
    return root
