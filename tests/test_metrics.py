"""Metrics are percentages; significance tests are paired and deterministic."""

import time

import numpy as np
import pytest
from scipy import stats

from pipeline.data.metrics import compute_metric, mcnemar_pvalue, paired_bootstrap, paired_bootstrap_pvalue
from pipeline.files.schema import CLASSIFICATION_METRICS

# gold 1 1 1 1 0 0 0 0 0 0 / pred 1 1 1 0 1 0 0 0 0 0 -> tp 3, fn 1, fp 1, tn 5
GOLD = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
PRED = [1, 1, 1, 0, 1, 0, 0, 0, 0, 0]


def test_accuracy_is_percent_correct():
    assert compute_metric("accuracy", PRED, GOLD) == pytest.approx(80.0)


def test_f1_is_of_the_positive_class_in_percent():
    # precision 3/4, recall 3/4
    assert compute_metric("f1", PRED, GOLD) == pytest.approx(75.0)
    # swapping the class names changes F1: it is not averaged over classes
    flip = lambda xs: [1 - x for x in xs]  # noqa: E731
    assert compute_metric("f1", flip(PRED), flip(GOLD)) == pytest.approx(100 * 2 * 5 / (2 * 5 + 1 + 1))


def test_matthews_matches_the_binary_formula_in_percent():
    tp, tn, fp, fn = 3, 5, 1, 1
    mcc = (tp * tn - fp * fn) / np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert compute_metric("matthews", PRED, GOLD) == pytest.approx(100 * mcc)
    assert compute_metric("matthews", GOLD, GOLD) == pytest.approx(100.0)
    assert compute_metric("matthews", [1 - y for y in GOLD], GOLD) == pytest.approx(-100.0)


def test_degenerate_predictions_score_zero_instead_of_nan():
    all_negative = [0] * len(GOLD)
    assert compute_metric("matthews", all_negative, GOLD) == 0.0
    assert compute_metric("f1", all_negative, GOLD) == 0.0


def test_matthews_handles_three_classes():
    gold = np.array([0, 0, 1, 1, 2, 2])
    assert compute_metric("matthews", gold, gold) == pytest.approx(100.0)
    assert compute_metric("matthews", [1, 2, 2, 0, 0, 1], gold) < 0


def test_bad_metric_inputs_are_rejected_clearly():
    with pytest.raises(ValueError, match="unknown metric 'acc'; allowed: accuracy, matthews, f1"):
        compute_metric("acc", PRED, GOLD)
    with pytest.raises(ValueError, match="same length"):
        compute_metric("accuracy", PRED[:-1], GOLD)
    with pytest.raises(ValueError, match="zero examples"):
        compute_metric("accuracy", [], [])
    with pytest.raises(ValueError, match="integer class ids"):
        compute_metric("accuracy", [0.9, 0.1], [1, 0])  # probabilities, not predictions
    with pytest.raises(ValueError, match="f1 is binary"):
        compute_metric("f1", [0, 1, 2], [0, 1, 2])


# --- paired bootstrap ---------------------------------------------------------------------------------


def systems(n=2000, acc_a=0.85, acc_b=0.80, seed=0):
    rng = np.random.default_rng(seed)
    gold = rng.integers(0, 2, n)
    a = np.where(rng.random(n) < acc_a, gold, 1 - gold)
    b = np.where(rng.random(n) < acc_b, gold, 1 - gold)
    return a, b, gold


@pytest.mark.parametrize("metric", CLASSIFICATION_METRICS)
def test_bootstrap_is_deterministic_per_seed(metric):
    a, b, gold = systems(acc_a=0.81, acc_b=0.80)
    p = paired_bootstrap_pvalue(metric, a, b, gold, n_resamples=300, seed=3)
    assert p == paired_bootstrap_pvalue(metric, a, b, gold, n_resamples=300, seed=3)
    assert 0.0 < p < 1.0
    others = {paired_bootstrap_pvalue(metric, a, b, gold, n_resamples=300, seed=s) for s in range(4, 8)}
    assert len(others | {p}) > 1  # the seed is actually used


def test_bootstrap_finds_a_large_gap_significant_in_either_direction():
    a, b, gold = systems()
    assert paired_bootstrap_pvalue("accuracy", a, b, gold) < 0.01
    assert paired_bootstrap_pvalue("accuracy", b, a, gold) < 0.01  # A worse than B: sign flips, p stays small


def test_bootstrap_p_counts_resamples_that_disagree_with_the_observed_sign():
    # Examples 0 and 3: only A right; example 1: only B right; example 2: both right. A leads by 2 to 1,
    # and p is the chance that a resample of 4 draws has no more A-only than B-only examples (ties count).
    gold = np.array([1, 1, 1, 1])
    a = np.array([1, 0, 1, 1])
    b = np.array([0, 1, 1, 0])
    p = paired_bootstrap_pvalue("accuracy", a, b, gold, n_resamples=20000, seed=0)
    probs = {"a": 0.5, "b": 0.25, "t": 0.25}
    exact = sum(
        stats.multinomial.pmf([i, j, 4 - i - j], 4, [probs["a"], probs["b"], probs["t"]])
        for i in range(5)
        for j in range(5 - i)
        if i <= j
    )
    assert p == pytest.approx(exact, abs=0.015)


def test_bootstrap_of_identical_systems_is_one():
    a, _, gold = systems()
    assert paired_bootstrap_pvalue("f1", a, a.copy(), gold) == 1.0


def test_bootstrap_is_fast_enough_for_ten_thousand_examples():
    a, b, gold = systems(n=10_000)
    start = time.perf_counter()
    paired_bootstrap_pvalue("accuracy", a, b, gold, n_resamples=1000)
    assert time.perf_counter() - start < 1.0


def test_the_bootstrap_takes_any_statistic_of_seeded_index_draws():
    # Per-example differences of two systems: delta* is their mean over each resample's indices.
    diff = np.random.default_rng(0).normal(0.1, 1.0, 50)
    p = paired_bootstrap(lambda idx: diff[idx].mean(axis=1), len(diff), n_resamples=500, seed=1)
    draws = np.random.default_rng(1).integers(0, 50, size=(500, 50), dtype=np.int32)
    assert p == np.mean(diff[draws].mean(axis=1) * np.sign(diff.mean()) <= 0)
    assert paired_bootstrap(lambda idx: np.zeros(len(idx)), 50) == 1.0  # no observed difference


def test_bootstrap_validates_its_inputs():
    a, b, gold = systems(n=10)
    with pytest.raises(ValueError, match="unknown metric"):
        paired_bootstrap_pvalue("bleu", a, b, gold)
    with pytest.raises(ValueError, match="same length"):
        paired_bootstrap_pvalue("accuracy", a, b[:5], gold)
    with pytest.raises(ValueError, match="n_resamples"):
        paired_bootstrap_pvalue("accuracy", a, b, gold, n_resamples=0)


# --- McNemar ------------------------------------------------------------------------------------------


def test_mcnemar_uses_the_exact_binomial_test_for_few_discordant_pairs():
    # 6 A-only wins, 1 B-only win, 3 ties
    correct_a = np.array([1] * 6 + [0] + [1] * 3, dtype=bool)
    correct_b = np.array([0] * 6 + [1] + [1] * 3, dtype=bool)
    expected = 2 * sum(stats.binom.pmf(k, 7, 0.5) for k in range(0, 2))  # two-sided, symmetric
    assert mcnemar_pvalue(correct_a, correct_b) == pytest.approx(expected)
    assert mcnemar_pvalue(correct_b, correct_a) == pytest.approx(expected)


def test_mcnemar_uses_continuity_corrected_chi_square_for_many_discordant_pairs():
    correct_a = np.array([1] * 40 + [0] * 20 + [1] * 100)
    correct_b = np.array([0] * 40 + [1] * 20 + [1] * 100)
    statistic = (abs(40 - 20) - 1) ** 2 / 60
    assert mcnemar_pvalue(correct_a, correct_b) == pytest.approx(stats.chi2.sf(statistic, 1))


def test_mcnemar_without_disagreements_is_one():
    same = np.array([True, False, True])
    assert mcnemar_pvalue(same, same) == 1.0


def test_mcnemar_validates_its_inputs():
    with pytest.raises(ValueError, match="same length"):
        mcnemar_pvalue([True, False], [True])
    with pytest.raises(ValueError, match="booleans"):
        mcnemar_pvalue([0, 2], [1, 1])  # class ids instead of right/wrong
