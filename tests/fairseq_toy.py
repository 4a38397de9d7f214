"""A tiny real fairseq model for the fairseq tests: a toy translation task (reverse the sentence and map each
word to its target word), binarised with `fairseq-preprocess` and learned by `fairseq-train` (embed 32, 2+2
layers, 4 heads, FFN 64; about 30 s on one CPU core). conftest.py trains it once per test session."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

WORDS = 24
SPLITS = {"train": 800, "valid": 20, "test": 100}


def toy_pairs(count: int, rng: random.Random) -> list[tuple[str, str]]:
    pairs = []
    for _ in range(count):
        words = [rng.randrange(WORDS) for _ in range(rng.randint(3, 8))]
        pairs.append((" ".join(f"s{w}" for w in words), " ".join(f"t{w}" for w in reversed(words))))
    return pairs


def fairseq_cli(tool: str, *args: str, cwd: Path) -> None:
    # The console scripts installed beside this interpreter, so a venv need not be on PATH.
    command = [str(Path(sys.executable).parent / tool), *args]
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    assert result.returncode == 0, f"{tool} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def train_toy_model(work: Path) -> Path:
    """Write the toy corpus to `work`, binarise it to `work/data-bin` and train; returns the checkpoint's path."""
    rng = random.Random(0)
    for split, count in SPLITS.items():
        pairs = toy_pairs(count, rng)
        (work / f"{split}.src").write_text("".join(f"{s}\n" for s, _ in pairs))
        (work / f"{split}.tgt").write_text("".join(f"{t}\n" for _, t in pairs))
    fairseq_cli("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", "train",
                "--validpref", "valid", "--testpref", "test", "--destdir", "data-bin", "--joined-dictionary",
                "--workers", "1", cwd=work)
    fairseq_cli("fairseq-train", str(work / "data-bin"), "--arch", "transformer", "--share-all-embeddings",
                "--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "32",
                "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
                "--encoder-attention-heads", "4", "--decoder-attention-heads", "4", "--dropout", "0.0",
                "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "0.005", "--lr-scheduler",
                "inverse_sqrt", "--warmup-updates", "50", "--criterion", "cross_entropy", "--max-tokens", "600",
                "--max-update", "300", "--seed", "1", "--cpu", "--num-workers", "0", "--disable-validation",
                "--save-dir", "checkpoints", "--no-epoch-checkpoints", "--log-format", "simple", cwd=work)
    return work / "checkpoints" / "checkpoint_last.pt"
