"""Task metrics and paired significance tests. Every metric is in percent (0-100), project-wide.

All metrics are computed from a confusion matrix, so the bootstrap can resample confusion counts for
1000 resamples at once instead of looping over them, and compute_metric and the bootstrap can never
disagree about what a metric means. `paired_bootstrap` is the test itself, for any metric (BLEU's
in pipeline/tasks/translation/bleu.py too).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy import stats

from pipeline.files.schema import CLASSIFICATION_METRICS

# McNemar: below this many discordant pairs the chi-square approximation is poor; use the exact test.
MCNEMAR_EXACT_BELOW = 25


def _check_name(name: str) -> None:
    if name not in CLASSIFICATION_METRICS:
        raise ValueError(f"unknown metric {name!r}; allowed: {', '.join(CLASSIFICATION_METRICS)}")


def _as_class_ids(predictions, labels) -> tuple[np.ndarray, np.ndarray, int]:
    pred, gold = np.asarray(predictions), np.asarray(labels)
    if pred.shape != gold.shape or pred.ndim != 1:
        raise ValueError(
            f"predictions and labels must be 1-d and the same length; got {pred.shape} and {gold.shape}"
        )
    if len(gold) == 0:
        raise ValueError("cannot score zero examples")
    for arr in (pred, gold):
        if not np.issubdtype(arr.dtype, np.integer) and not np.issubdtype(arr.dtype, np.bool_):
            raise ValueError(f"predictions and labels must be integer class ids; got dtype {arr.dtype}")
    pred, gold = pred.astype(np.int64), gold.astype(np.int64)
    if min(pred.min(), gold.min()) < 0:
        raise ValueError("class ids must be non-negative")
    return pred, gold, int(max(pred.max(), gold.max())) + 1


def _metric_from_confusion(name: str, conf: np.ndarray) -> np.ndarray:
    """Metric (percent) of confusion matrices conf[..., gold, pred]; works on a stack of them."""
    conf = conf.astype(np.float64)
    total = conf.sum(axis=(-2, -1))
    correct = np.trace(conf, axis1=-2, axis2=-1)
    if name == "accuracy":
        return 100.0 * correct / total
    if name == "matthews":
        # Multi-class MCC (Gorodkin 2004); for two classes it is the usual (tp*tn - fp*fn) / sqrt(...).
        # Defined as 0 when every prediction or every label is one class, as scikit-learn does.
        gold_counts, pred_counts = conf.sum(axis=-1), conf.sum(axis=-2)
        cov_gp = correct * total - (gold_counts * pred_counts).sum(axis=-1)
        cov_pp = total**2 - (pred_counts**2).sum(axis=-1)
        cov_gg = total**2 - (gold_counts**2).sum(axis=-1)
        denom = np.sqrt(cov_pp * cov_gg)
        return 100.0 * np.divide(cov_gp, denom, out=np.zeros_like(cov_gp), where=denom > 0)
    if name == "f1":
        # F1 of the positive class 1 (MRPC "equivalent", QQP "duplicate"); 0 when it has no true positives.
        tp, fp, fn = conf[..., 1, 1], conf[..., 0, 1], conf[..., 1, 0]
        denom = 2 * tp + fp + fn
        return 100.0 * np.divide(2 * tp, denom, out=np.zeros_like(tp), where=denom > 0)
    _check_name(name)
    raise AssertionError("unreachable")


def _confusion_codes(pred: np.ndarray, gold: np.ndarray, num_classes: int, name: str) -> np.ndarray:
    if name == "f1" and num_classes > 2:
        raise ValueError(f"f1 is binary (positive class 1) but got class ids up to {num_classes - 1}")
    return gold * num_classes + pred


def compute_metric(name: str, predictions, labels) -> float:
    """Score integer predictions against integer labels, in percent (MCC lies in [-100, 100])."""
    _check_name(name)
    pred, gold, k = _as_class_ids(predictions, labels)
    k = max(k, 2)
    codes = _confusion_codes(pred, gold, k, name)
    conf = np.bincount(codes, minlength=k * k).reshape(k, k)
    return float(_metric_from_confusion(name, conf))


def paired_bootstrap(
    resampled_deltas: Callable[[np.ndarray], np.ndarray], n: int, n_resamples: int = 1000, seed: int = 0
) -> float:
    """One-sided paired bootstrap p-value that system A's observed advantage over B is due to chance.

    Koehn (2004): draw `n_resamples` test sets of size n with replacement from the n examples, using
    the same draw for both systems, and compute delta* = metric(A) - metric(B) on each. With observed
    delta = metric(A) - metric(B) on the full set, p is the fraction of resamples whose delta* does
    not have the sign of delta, i.e. delta* <= 0 if delta > 0 and delta* >= 0 if delta < 0 (a tie
    counts against the observed difference). If delta == 0 there is no advantage to test and p = 1.

    `resampled_deltas(idx)` gives delta* of each row of `idx`, a (b, n) array of example indices; the
    observed delta is that of the full set, the one row 0..n-1. The draws come from a numpy Generator
    seeded with `seed`, so the p-value is deterministic for a given seed.
    """
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be positive; got {n_resamples}")
    observed = float(resampled_deltas(np.arange(n)[None, :])[0])
    if observed == 0:
        return 1.0
    rng = np.random.default_rng(seed)
    deltas = np.empty(n_resamples)
    chunk = max(1, 2_000_000 // n)  # resamples per block: bounds memory at ~16 MB of indices
    for start in range(0, n_resamples, chunk):
        b = min(chunk, n_resamples - start)
        deltas[start : start + b] = resampled_deltas(rng.integers(0, n, size=(b, n), dtype=np.int32))
    return float(np.mean(deltas * np.sign(observed) <= 0))


def paired_bootstrap_pvalue(
    metric_name: str, preds_a, preds_b, labels, n_resamples: int = 1000, seed: int = 0
) -> float:
    """`paired_bootstrap` of a classification metric: system A's predictions against system B's."""
    _check_name(metric_name)
    pred_a, gold, k_a = _as_class_ids(preds_a, labels)
    pred_b, _, k_b = _as_class_ids(preds_b, labels)
    k = max(k_a, k_b, 2)
    codes_a = _confusion_codes(pred_a, gold, k, metric_name)
    codes_b = _confusion_codes(pred_b, gold, k, metric_name)
    cells = k * k

    def resampled_deltas(idx: np.ndarray) -> np.ndarray:
        # One confusion matrix per resample, all counted by a single bincount over offset cell codes.
        b = len(idx)
        offset = (np.arange(b) * cells)[:, None]
        conf_a = np.bincount((codes_a[idx] + offset).ravel(), minlength=b * cells).reshape(b, k, k)
        conf_b = np.bincount((codes_b[idx] + offset).ravel(), minlength=b * cells).reshape(b, k, k)
        return _metric_from_confusion(metric_name, conf_a) - _metric_from_confusion(metric_name, conf_b)

    return paired_bootstrap(resampled_deltas, len(gold), n_resamples, seed)


def mcnemar_pvalue(correct_a, correct_b) -> float:
    """Two-sided McNemar test that systems A and B have the same error rate on the same examples.

    Only discordant examples count: b = A right and B wrong, c = A wrong and B right. With fewer than
    MCNEMAR_EXACT_BELOW discordant pairs the exact binomial test (b ~ Binomial(b + c, 1/2)) is used,
    otherwise the chi-square statistic (|b - c| - 1)^2 / (b + c) with 1 degree of freedom (with
    continuity correction). No discordant pairs means no evidence of a difference: p = 1.
    """
    a, b_ = np.asarray(correct_a), np.asarray(correct_b)
    if a.shape != b_.shape or a.ndim != 1:
        raise ValueError(
            f"correct_a and correct_b must be 1-d and the same length; got {a.shape} and {b_.shape}"
        )
    if not (np.isin(a, (0, 1)).all() and np.isin(b_, (0, 1)).all()):
        raise ValueError("correct_a and correct_b must be booleans (or 0/1): was each example right?")
    a, b_ = a.astype(bool), b_.astype(bool)
    b = int(np.sum(a & ~b_))
    c = int(np.sum(~a & b_))
    if b + c == 0:
        return 1.0
    if b + c < MCNEMAR_EXACT_BELOW:
        return float(stats.binomtest(b, b + c, 0.5).pvalue)
    statistic = (abs(b - c) - 1) ** 2 / (b + c)
    return float(stats.chi2.sf(statistic, df=1))
