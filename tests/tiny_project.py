"""A tiny copy of this project for end-to-end tests: this repo's stage code and dvc.yaml, a tiny random
BERT and a small local CSV in the GLUE schema, in a fresh git + DVC repository."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import transformers
import yaml

from pipeline.config.trace import TRACE_ENV

STAGES = ["prepare", "finetune", "ablate", "score", "prune", "recover", "benchmark", "report"]
ROOT = Path(__file__).resolve().parents[1]
# The columns of the MT experiment's tables, whichever backend (tests/test_translation_e2e.py checks the
# Marian path, tests/test_fairseq_e2e.py the fairseq path).
MT_COLUMNS = {
    "ablation.csv": ["kind", "layer", "head", "metric", "delta", "p_value", "examples"],
    "one_head.csv": ["kind", "layer", "best_head", "metric", "delta"],
    "importance.csv": ["kind", "layer", "head", "importance", "importance_raw"],
    "pruning_curve.csv": ["method", "split", "fraction_pruned", "heads_pruned", "metric", "fraction_flops_removed",
                          "examples", "metric_std"],
    "benchmark.csv": ["attn_implementation", "batch_size", "fraction_pruned", "examples_per_s", "tokens_per_s",
                      "speedup", "ideal_speedup", "params"],
}
WORDS = "good great fine fun superb moving bad awful dull boring weak poor the a film movie plot cast is was".split()


def run(cmd: list[str], cwd: Path, extra_env: dict[str, str] | None = None) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "DVC_NO_ANALYTICS": "1", "TQDM_DISABLE": "1", **(extra_env or {})}
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
    # Off here: the projects of the flow tests exercise DVC and Prefect, not the method; test_pipeline_e2e turns
    # it on (with_budgeted) for the pipeline's own repository.
    params["prune"]["budgeted"].update(methods=[], save_levels=[])
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


def with_budgeted(params: dict) -> dict:
    """`params` with the budgeted pruning methods on, at two levels on small samples."""
    params["prune"]["budgeted"].update(methods=["budgeted-heads", "budgeted", "budgeted-tuned"], levels=[0.2, 0.4],
                                       save_levels=[0.4], fisher_examples=64, tune_examples=32)
    return params


def make_tiny_project(root: Path, extra_files: tuple[str, ...] = (), params: dict | None = None) -> Path:
    """A git + DVC repository at `root` with `params` (default: the tiny params); nothing reproduced yet."""
    for package in ("pipeline", "stages"):
        shutil.copytree(ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("dvc.yaml", ".gitignore", ".dvcignore", *extra_files):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, root / name)
    (root / "params.yaml").write_text(yaml.safe_dump(params or tiny_params(), sort_keys=False))
    write_tiny_assets(root)
    run(["git", "init", "-q"], root)
    run(["dvc", "init", "-q", "-f"], root)
    shutil.copy(ROOT / ".dvc" / "config", root / ".dvc" / "config")  # analytics off, the offline plots template
    shutil.copytree(ROOT / ".dvc" / "plots", root / ".dvc" / "plots")  # the tables' plot templates
    (root / "reports").mkdir()
    shutil.copy(ROOT / "reports" / "plots_template.html", root / "reports" / "plots_template.html")
    return root


def commit_all(root: Path, message: str) -> None:
    run(["git", "add", "-A"], root)
    run(["git", "-c", "user.name=test", "-c", "user.email=test@example.com", "commit", "-qm", message], root)


def traced_env(trace_dir: Path) -> dict[str, str]:
    """Run the stages recording which params each reads (pipeline/config/trace.py)."""
    return {TRACE_ENV: str(trace_dir)}


def undeclared_params(repo: Path, pipeline: str, trace_dir: Path) -> dict[str, list[str]]:
    """Per stage, the params it read (as traced) that its entry in `pipeline` does not declare. A read of a key
    that the params file does not set is a default, which DVC has no value of to track, and so is not counted."""
    stages = yaml.safe_load((repo / pipeline).read_text())["stages"]
    params_file = (repo / pipeline).parent / "params.yaml"
    values = yaml.safe_load(params_file.read_text())

    def is_set(key: str) -> bool:
        node = values
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    missing = {}
    for name, stage in stages.items():
        declared: list[str] = []
        for entry in stage.get("params", []):
            declared += [entry] if isinstance(entry, str) else [k for keys in entry.values() for k in keys]
        trace = trace_dir / f"{name}.json"
        reads = json.loads(trace.read_text()) if trace.exists() else []
        uncovered = [r for r in reads if is_set(r) and not any(r == d or r.startswith(f"{d}.") for d in declared)]
        if uncovered:
            missing[name] = uncovered
    return missing
