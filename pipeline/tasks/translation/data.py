"""Task data for machine translation: load, split, tokenize.

Every source ends up as a DatasetDict with "train", "dev" and "test" splits holding two string
columns, "source" and "target" (one row per sentence pair, in the requested direction). Sources:

- "default": the offline default, English-Spanish sentence pairs from Tatoeba (CC-BY 2.0 FR) as
  packaged by manythings.org (see assets.MT_DATA), split by `split_by_source`.
- "wmt14/<xx>-en" and "iwslt2017/<xx>-<yy>": the Hugging Face hub. WMT14's validation set
  (newstest2013) is our dev and its test set (newstest2014) our test, as in Vaswani et al. (2017)
  and Michel et al. (2019); IWSLT2017 likewise maps validation -> dev, test -> test.
- a local CSV/TSV/JSON/JSONL file, or a directory holding train.* and optionally dev.* (or
  validation.*) and test.*, with either named source/target columns or the hub's schema, a
  "translation" column of {language code: sentence} dicts.

Evaluation sets can be capped (`max_eval_pairs`) because beam search on a CPU is slow.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import datasets
import numpy as np
import pandas as pd
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from pipeline.data.catalog import HUB_CORPORA
from pipeline.data.local_files import InputError, check_fractions, split_files
from pipeline.data.readers import load_tatoeba_pairs
from pipeline.files.schema import DEFAULT, EVAL_SPLITS, SPLITS
from pipeline.tasks.translation.inputs import local_pairs, read_pairs

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TATOEBA_LANGS = ("en", "es")  # the columns of spa.tsv, in file order


# --- the offline default -----------------------------------------------------------------------------




# --- splitting ---------------------------------------------------------------------------------------


def _pair_groups(df: pd.DataFrame) -> np.ndarray:
    """Group id of every row: the connected components of the graph linking each source sentence to
    each of its targets. Rows sharing a source or a target are in one group, so a split made of whole
    groups puts no dev/test sentence, on either side, into train. On Tatoeba en-es the largest group
    has 68 pairs, so the groups are small enough to split finely."""
    src = pd.factorize(df["source"])[0]
    tgt = pd.factorize(df["target"])[0] + src.max() + 1  # one node numbering for both sides
    n = int(tgt.max()) + 1
    graph = coo_matrix((np.ones(len(src)), (src, tgt)), shape=(n, n))
    return connected_components(graph, directed=False)[1][src]


def split_by_source(
    df: pd.DataFrame,
    fractions: tuple[float, ...] = (0.8, 0.1, 0.1),
    seed: int = 0,
    max_eval_pairs: int | None = None,
) -> dict[str, pd.DataFrame]:
    """Split pairs into train/dev/test (or len(fractions) parts, named SPLITS then part3, ...) by group.

    All translations of one source sentence stay in one split (and, more strictly, every row sharing a
    source or target sentence: see _pair_groups), so the model is never tested on a sentence it was
    trained on. Groups are permuted by a seeded numpy Generator and the split boundaries fall at the
    first group reaching the cumulative fraction of rows, so the row fractions are exact up to one group.

    Evaluation splits keep one row per pair: a source with k translations is scored k times with one
    reference each, rather than once against k references, so each row is an ordinary (source, target)
    example for both BLEU and the importance loss. `max_eval_pairs` caps every split after the first:
    whole groups are kept in permuted order while they fit, and the rest is dropped (not moved to
    train), so train does not depend on the cap. Rows keep their file order within a split.
    """
    f = check_fractions(fractions)
    missing = {"source", "target"} - set(df.columns)
    if missing:
        raise ValueError(f"split_by_source needs columns source, target; missing {sorted(missing)}")
    if max_eval_pairs is not None and max_eval_pairs < 1:
        raise ValueError(f"max_eval_pairs must be positive (or None for no cap); got {max_eval_pairs}")
    if len(df) == 0:
        raise ValueError("split_by_source got no pairs")
    groups = _pair_groups(df)
    group_sizes = np.bincount(groups)
    order = np.random.default_rng(seed).permutation(len(group_sizes))
    # A group goes to the part whose cumulative-fraction interval holds its first row.
    starts = np.cumsum(group_sizes[order]) - group_sizes[order]
    part_of = np.searchsorted(np.cumsum(f)[:-1] * len(df), starts, side="right")
    names = [*SPLITS, *(f"part{i}" for i in range(len(SPLITS), len(f)))][: len(f)]
    out = {}
    for k, name in enumerate(names):
        chosen = order[part_of == k]
        if k > 0 and max_eval_pairs is not None:
            chosen = chosen[np.cumsum(group_sizes[chosen]) <= max_eval_pairs]
        rows = np.flatnonzero(np.isin(groups, chosen))
        out[name] = df.iloc[rows].reset_index(drop=True)
    return out


# --- sources -----------------------------------------------------------------------------------------


def fetch_hub_translation(repo: str, config: str) -> datasets.DatasetDict:
    """The only hub call (kept alone so tests can replace it with local data)."""
    return datasets.load_dataset(repo, config)


def _to_dataset(df: pd.DataFrame) -> datasets.Dataset:
    features = datasets.Features({"source": datasets.Value("string"), "target": datasets.Value("string")})
    frame = df[["source", "target"]].reset_index(drop=True)
    return datasets.Dataset.from_pandas(frame, features=features, preserve_index=False)


def _check_pair(langs: tuple[str, ...], source_lang: str, target_lang: str, where: str) -> None:
    if source_lang == target_lang or {source_lang, target_lang} != set(langs):
        raise InputError(
            f"{where} has languages {'-'.join(langs)}; got source_lang={source_lang!r}, "
            f"target_lang={target_lang!r} (allowed: {langs[0]}->{langs[1]} or {langs[1]}->{langs[0]})"
        )


def _cap(ds: datasets.Dataset, max_pairs: int | None, seed: int) -> datasets.Dataset:
    """A seeded subsample of at most `max_pairs` rows, in the original order."""
    if max_pairs is None or len(ds) <= max_pairs:
        return ds
    keep = np.sort(np.random.default_rng(seed).choice(len(ds), size=max_pairs, replace=False))
    return ds.select(keep)


def _from_translation_dicts(ds: datasets.Dataset, source_lang: str, target_lang: str, where: str) -> datasets.Dataset:
    first = ds[0]["translation"] if len(ds) else {}
    missing = [lang for lang in (source_lang, target_lang) if lang not in first]
    if missing:
        raise InputError(f"{where}: 'translation' has no language(s) {missing}; it has {sorted(first)}")

    def pick(batch):
        return {
            "source": [t[source_lang] for t in batch["translation"]],
            "target": [t[target_lang] for t in batch["translation"]],
        }

    return ds.map(pick, batched=True, remove_columns=ds.column_names, desc=f"{where}: {source_lang}->{target_lang}")


def _load_hub(
    name: str,
    source_lang: str | None,
    target_lang: str | None,
    max_train_pairs: int | None,
    max_eval_pairs: int | None,
    seed: int,
) -> datasets.DatasetDict:
    corpus_name, _, pair = name.partition("/")
    corpus = HUB_CORPORA[corpus_name]
    if pair not in corpus.pairs:
        raise InputError(f"unknown {corpus_name} language pair {pair!r}; allowed: {', '.join(corpus.pairs)}")
    langs = tuple(pair.split("-"))
    source_lang, target_lang = source_lang or langs[0], target_lang or langs[1]
    _check_pair(langs, source_lang, target_lang, name)
    try:
        raw = fetch_hub_translation(corpus.repo, corpus.config_prefix + pair)
    except Exception as e:
        raise InputError(
            f"{name}: could not load {corpus.repo} (config {corpus.config_prefix + pair}) from the hub: "
            f"{type(e).__name__}: {e}. Offline, pass local train/dev/test files instead."
        ) from e
    out = {}
    for ours, theirs in corpus.splits:
        if theirs not in raw:
            raise InputError(f"{name}: split {theirs!r} missing; available: {list(raw)}")
        if "translation" not in raw[theirs].column_names:
            raise InputError(f"{name} split {theirs!r}: no 'translation' column; has {raw[theirs].column_names}")
        ds = _cap(raw[theirs], max_train_pairs if ours == "train" else max_eval_pairs, seed)
        out[ours] = _from_translation_dicts(ds, source_lang, target_lang, f"{name} {theirs}")
    return datasets.DatasetDict(out)


def _load_local(
    pairs: Mapping[str, tuple[list[str], list[str]]],
    fractions: tuple[float, float, float],
    max_eval_pairs: int | None,
    seed: int,
) -> datasets.DatasetDict:
    frames = {split: pd.DataFrame({"source": sources, "target": targets})
              for split, (sources, targets) in pairs.items()}
    f = check_fractions(fractions)
    train = frames.pop("train")
    # Carve any missing evaluation split out of train, by group as for the default corpus.
    need = [s for s in EVAL_SPLITS if s not in frames]
    if need:
        kept = np.array([f[0], *(f[SPLITS.index(s)] for s in need)])
        parts = split_by_source(train, tuple(kept / kept.sum()), seed, max_eval_pairs)
        train = parts["train"]
        for s, key in zip(need, SPLITS[1:], strict=False):
            frames[s] = parts[key]
    dsd = {"train": _to_dataset(train)}
    for s in EVAL_SPLITS:
        dsd[s] = _cap(_to_dataset(frames[s]), max_eval_pairs, seed)
    empty = [s for s, ds in dsd.items() if not len(ds)]
    if empty:  # whole groups of pairs sharing a sentence are cut, so a small file can leave a split empty
        raise InputError(f"data: the {' and '.join(empty)} split(s) got no pairs out of {len(train)} training pairs "
                         f"cut by data.fractions {list(fractions)}; give more pairs, or dev and test files")
    return datasets.DatasetDict(dsd)


def load_translation_task(
    source: str,
    source_lang: str | None = None,
    target_lang: str | None = None,
    *,
    tatoeba_path: str | Path | None = None,
    files: Mapping[str, str | Path] | None = None,
    source_column: str = "source",
    target_column: str = "target",
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    max_train_pairs: int | None = None,
    max_eval_pairs: int | None = None,
    seed: int = 0,
) -> datasets.DatasetDict:
    """Load any supported source as train/dev/test with string columns source, target.

    source: "default" (Tatoeba en-es at `tatoeba_path`), "wmt14/<pair>", "iwslt2017/<pair>", a local
        file (split by `fractions`), a local directory holding train.* (+ dev.*/validation.*, test.*),
        or "local" together with `files` (split name -> path).
    source_lang, target_lang: the direction. Default: en->es for "default", the pair's order for the
        hub (e.g. "wmt14/fr-en" -> fr->en). Local files need them only for the "translation" schema.
    max_train_pairs: a seeded subsample of hub train sets (WMT14 fr-en has ~40M pairs).
    max_eval_pairs: cap on dev and test (seeded; by group where the split is carved here).
    """
    for name, value in (("max_train_pairs", max_train_pairs), ("max_eval_pairs", max_eval_pairs)):
        if value is not None and value < 1:
            raise InputError(f"{name} must be positive (or None for no cap); got {value}")
    if source == DEFAULT:
        if tatoeba_path is None:
            raise ValueError("source 'default' needs tatoeba_path (spa.tsv, see assets.MT_DATA)")
        source_lang, target_lang = source_lang or TATOEBA_LANGS[0], target_lang or TATOEBA_LANGS[1]
        _check_pair(TATOEBA_LANGS, source_lang, target_lang, "the default Tatoeba corpus")
        df = load_tatoeba_pairs(tatoeba_path)
        if source_lang != TATOEBA_LANGS[0]:
            df = df.rename(columns={"source": "target", "target": "source"})
        parts = split_by_source(df, fractions, seed, max_eval_pairs)
        return datasets.DatasetDict({s: _to_dataset(parts[s]) for s in SPLITS})
    if source.partition("/")[0] in HUB_CORPORA:
        return _load_hub(source, source_lang, target_lang, max_train_pairs, max_eval_pairs, seed)
    if files is not None:
        paths = split_files(source, files)
        pairs = {split: read_pairs(path, source_column, target_column, source_lang, target_lang)
                 for split, path in paths.items()}
    else:
        pairs = local_pairs(source, source_column, target_column, source_lang, target_lang)
    return _load_local(pairs, fractions, max_eval_pairs, seed)


# --- tokenization ------------------------------------------------------------------------------------


def tokenize_pairs(
    dsd: datasets.DatasetDict, tokenizer: PreTrainedTokenizerBase, max_length: int = 128
) -> datasets.DatasetDict:
    """Tokenize every split to input_ids, attention_mask (source) and labels (target, ending in </s>).

    Both sides are truncated to max_length tokens (the </s> is kept) but not padded: batches are padded
    to their own longest sequence, labels with -100 so padding is never scored. The text columns stay:
    BLEU is computed on the raw references, not on detokenised pieces.
    """

    def encode(batch):
        return tokenizer(batch["source"], text_target=batch["target"], truncation=True, max_length=max_length)

    return datasets.DatasetDict(
        {
            name: ds.map(encode, batched=True, desc=f"tokenize {name}")
            for name, ds in dsd.items()
        }
    )
