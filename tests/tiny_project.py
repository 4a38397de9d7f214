"""A tiny copy of this project for end-to-end tests: this repo's stage code and dvc.yaml, a tiny random
BERT and a small local CSV in the GLUE schema, in a fresh git + DVC repository."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from pipeline.checks.tiny_project import make_tiny_project as library_make_tiny_project
from pipeline.checks.tiny_project import tiny_params as library_tiny_params
from pipeline.checks.tiny_project import tool_env
from pipeline.config.trace import TRACE_ENV

STAGES = ["prepare", "finetune", "ablate", "score", "prune", "recover", "benchmark", "report"]
ROOT = Path(__file__).resolve().parents[1]
# The columns of the MT experiment's tables, whichever backend (tests/test_translation_e2e.py checks the
# Marian path, tests/test_fairseq_e2e.py the fairseq path).
MT_COLUMNS = {
    "ablation.csv": ["kind", "layer", "head", "metric", "delta", "p_value", "examples"],
    "one_head.csv": ["kind", "layer", "best_head", "metric", "delta"],
    "importance.csv": ["kind", "layer", "head", "importance", "importance_raw", "precision"],
    "pruning_curve.csv": ["method", "split", "fraction_pruned", "heads_pruned", "metric", "fraction_flops_removed",
                          "examples", "metric_std"],
    "benchmark.csv": ["attn_implementation", "batch_size", "fraction_pruned", "examples_per_s", "tokens_per_s",
                      "speedup", "speedup_q1", "speedup_q3", "speedup_min", "speedup_max", "ideal_speedup", "params",
                      "device", "precision"],
}


def run(cmd: list[str], cwd: Path, extra_env: dict[str, str] | None = None) -> str:
    result = subprocess.run(cmd, cwd=cwd, env=tool_env(extra_env), capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def ran_stages(output: str) -> list[str]:
    return re.findall(r"Running stage '([^']+)'", output)


def tiny_params() -> dict:
    return library_tiny_params(ROOT)


def make_tiny_project(root: Path, extra_files: tuple[str, ...] = (), params: dict | None = None) -> Path:
    """A git + DVC repository at `root` with `params` (default: the tiny params); nothing reproduced yet."""
    return library_make_tiny_project(root, params, extra_files, source=ROOT)


def make_pipeline_repo(root: Path, pipeline: str, params: dict) -> Path:
    """A git + DVC repository at `root` with this repo's stage code and the `pipeline` folder's dvc.yaml (mt,
    mt-fairseq, llm), `params` as its params.yaml; nothing reproduced yet."""
    for package in ("pipeline", "stages"):
        shutil.copytree(ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    (root / pipeline).mkdir()
    shutil.copy(ROOT / pipeline / "dvc.yaml", root / pipeline / "dvc.yaml")
    (root / pipeline / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(["git", "init", "-q"], root)
    run(["dvc", "init", "-q"], root)
    shutil.copy(ROOT / ".dvc" / "config", root / ".dvc" / "config")
    shutil.copytree(ROOT / ".dvc" / "plots", root / ".dvc" / "plots")
    shutil.copy(ROOT / ".dvcignore", root / ".dvcignore")  # no __pycache__ in the code deps' hashes
    return root


def with_budgeted(params: dict) -> dict:
    """`params` with the budgeted pruning methods on, at two levels on small samples, neurons kept in blocks of 4
    (a fixed multiple: a measured one would make the bytes depend on the machine's timings)."""
    params["prune"]["budgeted"].update(methods=["budgeted-heads", "budgeted", "budgeted-tuned"], levels=[0.2, 0.4],
                                       save_levels=[0.4], fisher_examples=64, tune_examples=32, width_multiple=4)
    return params


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
            # A bare key is DVC's default file, params.yaml beside the repo's root; a mapping names its file.
            if isinstance(entry, str):
                declared += [entry] if params_file == repo / "params.yaml" else []
            else:
                declared += [k for file, keys in entry.items() if repo / file == params_file for k in keys]
        trace = trace_dir / f"{name}.json"
        reads = json.loads(trace.read_text()) if trace.exists() else []
        uncovered = [r for r in reads if is_set(r) and not any(r == d or r.startswith(f"{d}.") for d in declared)]
        if uncovered:
            missing[name] = uncovered
    return missing


# The MT experiment's tiny configuration (tests/test_translation_e2e.py, tests/test_mt_budget.py): generated
# English-Spanish pairs over a twelve-word lexicon, and a tiny Marian trained from scratch on them.
LEXICON = {"the": "el", "cat": "gato", "dog": "perro", "eats": "come", "sees": "ve", "big": "grande",
           "small": "pequeño", "house": "casa", "in": "en", "runs": "corre", "bird": "pájaro", "red": "rojo"}


def tiny_mt_params() -> dict:
    params = yaml.safe_load((ROOT / "mt" / "params.yaml").read_text())
    params["experiment"] = "tiny-mt"
    params["model"].update(vocab_size=120, d_model=32, encoder_layers=2, decoder_layers=2, heads=4, ffn_dim=64)
    params["data"].update(source="pairs.tsv", max_eval_pairs=30, max_length=16)
    params["finetune"].update(steps=40, max_tokens=512, warmup_steps=10, checkpoint_steps=[10, 20])
    params["translate"].update(num_beams=2, batch_size=16, max_new_tokens=12)
    params["ablate"].update(max_examples=20, n_resamples=100)
    params["score"].update(max_examples=32, batch_size=16)
    params["prune"].update(step=0.25, max_fraction=0.75, save_fractions=[0.25, 0.5], max_examples=20)
    params["benchmark"].update(batch_sizes=[1, 4], new_tokens=4, repeats=1, turn_seconds=0)
    return params


def write_pairs(path: Path, n: int = 300) -> None:
    rng = np.random.default_rng(0)
    words = list(LEXICON)
    rows = []
    for _ in range(n):
        sentence = rng.choice(words, size=int(rng.integers(3, 7))).tolist()
        rows.append({"source": " ".join(sentence), "target": " ".join(LEXICON[w] for w in sentence)})
    pd.DataFrame(rows).to_csv(path, sep="\t", index=False)
