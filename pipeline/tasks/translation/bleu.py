"""Corpus BLEU (sacrebleu) and its paired bootstrap test."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from pipeline.data.metrics import paired_bootstrap

if TYPE_CHECKING:
    from sacrebleu.metrics import BLEU


def _sacrebleu_metric() -> BLEU:
    """sacrebleu's BLEU with its defaults. Imported here, not at the top: sacrebleu loads portalocker and redis
    (0.6 s on 2 CPU cores), and every stage imports this module through the experiment, but only translation
    experiments score BLEU."""
    from sacrebleu.metrics import BLEU

    return BLEU()


def check_lengths(references: Sequence[str], **hypotheses: Sequence[str]) -> None:
    """Raise unless there are references and every named list of sentences has one per reference."""
    if len(references) == 0:
        raise ValueError("cannot score zero sentences")
    for name, hyps in hypotheses.items():
        if len(hyps) != len(references):
            raise ValueError(f"{name} has {len(hyps)} sentences but there are {len(references)} references")


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[float, str]:
    """Corpus BLEU (sacrebleu defaults: 13a tokenisation, mixed case, exp smoothing), one reference
    per hypothesis, and sacrebleu's signature string, which the report quotes so scores are comparable."""
    check_lengths(references, hypotheses=hypotheses)
    metric = _sacrebleu_metric()
    score = metric.corpus_score(list(hypotheses), [list(references)])
    return float(score.score), str(metric.get_signature())


def bleu_paired_pvalue(
    system_hyps: Sequence[str],
    baseline_hyps: Sequence[str],
    references: Sequence[str],
    n_resamples: int = 1000,
    seed: int = 0,
) -> float:
    """One-sided paired bootstrap p-value that the system's observed BLEU advantage over the baseline
    (or disadvantage) is due to chance: `metrics.paired_bootstrap` (Koehn 2004) of corpus BLEU.

    sacrebleu's own PairedTest is two-sided (it tests |delta| against a re-centred distribution) and
    takes its seed from an environment variable, so it is not used; its per-sentence sufficient
    statistics are, so BLEU on a resample is a sum plus sacrebleu's own formula and agrees exactly with
    corpus_score.
    """
    check_lengths(references, system_hyps=system_hyps, baseline_hyps=baseline_hyps)
    metric = _sacrebleu_metric()
    refs = [list(references)]
    stats_sys = np.asarray(metric._extract_corpus_statistics(list(system_hyps), refs), dtype=np.int64)
    stats_base = np.asarray(metric._extract_corpus_statistics(list(baseline_hyps), refs), dtype=np.int64)

    def score(summed: np.ndarray) -> float:
        return metric._compute_score_from_stats([int(v) for v in summed]).score

    def resampled_deltas(idx: np.ndarray) -> np.ndarray:
        # counts[r, i] = how often sentence i was drawn in resample r; summed stats = counts @ stats.
        b, n = idx.shape
        counts = np.bincount((idx + (np.arange(b) * n)[:, None]).ravel(), minlength=b * n).reshape(b, n)
        return np.array([score(s) - score(t) for s, t in zip(counts @ stats_sys, counts @ stats_base, strict=True)])

    return paired_bootstrap(resampled_deltas, len(references), n_resamples, seed)
