"""Recovery by distillation from the unpruned model (pipeline/tasks/language_modeling/distillation.py): the KL loss
the kd- methods train on, its top-k stand-in, and the general-English recovery windows
(pipeline/tasks/language_modeling/recovery_data.py). Models are tiny random decoders built from configs."""

from __future__ import annotations

import copy
import gzip

import numpy as np
import pandas as pd
import pytest
import torch

from pipeline.studies.recovery_budget import tokens_for
from pipeline.studies.recovery_settings import best_settings
from pipeline.tasks.language_modeling.distillation import (
    Teacher,
    distillation_objective,
    kd_token_loss,
    kd_top_k_loss,
)
from pipeline.tasks.language_modeling.llama import collate_texts
from pipeline.tasks.language_modeling.recovery_data import (
    detokenized_wikitext,
    packed_windows,
    recovery_windows,
    sampled_texts,
)
from pipeline.tasks.language_modeling.training import RecoveryConfig, recover_language_model
from tests.test_lora_recovery import FAST, pruned, sequences, unpruned
from tests.tiny_models import PAD


def _batch() -> dict[str, torch.Tensor]:
    return collate_texts(sequences(6), PAD)  # rows of unequal length: padding that the loss must leave out


def _logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


def test_the_kd_loss_is_zero_when_student_and_teacher_are_the_same_model():
    model, batch = unpruned(), _batch()
    objective = distillation_objective(Teacher(copy.deepcopy(model)))
    with torch.no_grad():
        loss = objective(model.eval(), batch, np.arange(6))
    assert loss.shape == (6,)
    torch.testing.assert_close(loss, torch.zeros(6), atol=1e-6, rtol=0)


def test_distilled_from_itself_a_model_gets_no_gradient_but_rounding_which_is_why_the_stage_skips_that_control():
    model, batch = unpruned(), _batch()
    objective = distillation_objective(Teacher(copy.deepcopy(model)))
    objective(model.train(), batch, np.arange(6)).sum().backward()
    largest = max(param.grad.abs().max().item() for param in model.parameters() if param.grad is not None)
    assert largest < 1e-6  # Adam, which divides by the gradient's own scale, would turn this rounding into steps


def test_the_kd_loss_is_positive_and_falls_over_a_few_steps_on_a_tiny_pruned_model():
    losses = recover_language_model(pruned(), sequences(), PAD, RecoveryConfig(**FAST, method="kd-lora"),
                                    progress=False, teacher=Teacher(unpruned()))
    assert losses[0] > 0
    assert np.mean(losses[-3:]) < 0.7 * np.mean(losses[:3])


def test_full_distillation_trains_every_weight_towards_the_teacher():
    losses = recover_language_model(pruned(), sequences(), PAD,
                                    RecoveryConfig(**{**FAST, "learning_rate": 3e-3}, method="kd-full"),
                                    progress=False, teacher=Teacher(unpruned()))
    assert np.mean(losses[-3:]) < 0.7 * np.mean(losses[:3])


def test_the_kd_loss_leaves_padding_out_and_scales_by_the_temperature_squared():
    batch = _batch()
    student, teacher = _logits(pruned(), batch), _logits(unpruned(), batch)
    garbage = teacher.clone()
    garbage[batch["attention_mask"] == 0] = 1e4  # whatever sits on padding changes nothing
    torch.testing.assert_close(kd_token_loss(student, garbage, batch["labels"]),
                               kd_token_loss(student, teacher, batch["labels"]))
    # At temperature T both distributions soften; T^2 keeps the loss on the scale of T = 1 for nearby logits.
    near = teacher + 0.01 * torch.randn(teacher.shape, generator=torch.Generator().manual_seed(0))
    ratio = kd_token_loss(near, teacher, batch["labels"], 2.0) / kd_token_loss(near, teacher, batch["labels"], 1.0)
    assert ratio.mean().item() == pytest.approx(1.0, abs=0.05)


def test_the_top_k_loss_is_the_exact_kl_with_the_whole_vocabulary_and_bounds_it_from_above_with_less():
    batch = _batch()
    student, teacher = _logits(pruned(), batch), _logits(unpruned(), batch)
    exact = kd_token_loss(student, teacher, batch["labels"])
    vocab = teacher.shape[-1]
    whole = kd_top_k_loss(student, *teacher[:, :-1].topk(vocab, dim=-1), batch["labels"])
    torch.testing.assert_close(whole, exact, rtol=1e-5, atol=1e-6)
    few = kd_top_k_loss(student, *teacher[:, :-1].topk(4, dim=-1), batch["labels"])
    assert (few >= 0).all()


def test_a_top_k_teacher_runs_once_per_batch_for_every_student():
    teacher = Teacher(unpruned(), top_k=8)
    calls = []
    teacher.model.register_forward_hook(lambda *_: calls.append(1))
    for _ in range(2):  # two students on the same batches
        recover_language_model(pruned(), sequences(), PAD, RecoveryConfig(**FAST, method="kd-lora"),
                               progress=False, teacher=teacher)
    assert len(calls) == FAST["steps"]


def test_a_distillation_method_without_a_teacher_is_refused_in_one_line():
    with pytest.raises(ValueError, match="distils from the unpruned model: pass teacher="):
        recover_language_model(pruned(), sequences(), PAD, RecoveryConfig(**FAST, method="kd-lora"), progress=False)


def test_wikitexts_tokenisation_is_undone_and_its_headings_left_out(tmp_path):
    path = tmp_path / "train.raw.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(" = Valkyria Chronicles III = \n\n The game 's 2 @,@ 000 @-@ strong cast , led by Kurou , won . \n")
    assert detokenized_wikitext(path) == ["The game's 2,000-strong cast, led by Kurou, won."]


def test_packed_windows_are_whole_windows_of_the_texts_joined_in_order_and_more_extend_fewer():
    texts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    windows = packed_windows(texts, window=4, count=3, separator=[0])
    assert windows == [[1, 2, 3, 0], [4, 5, 0, 6], [7, 8, 9, 0]]
    many = packed_windows(texts, window=4, count=10, separator=[0])  # short texts are read again
    assert len(many) == 10 and all(len(w) == 4 for w in many) and many[:3] == windows


def test_recovery_windows_take_equal_shares_of_each_source_in_turn_so_a_smaller_budget_is_a_prefix():
    a, b = [[1] * 50, [3] * 50], [[2] * 50, [4] * 50]
    windows = recovery_windows([a, b], window=5, count=5, separator=[])
    assert [w[0] for w in windows] == [1, 2, 1, 2, 1]
    assert recovery_windows([a, b], window=5, count=9, separator=[])[:5] == windows


def test_a_sampled_draw_is_seeded_and_a_longer_one_extends_it():
    texts = [f"text {i} " * (i + 1) for i in range(50)]
    short, long = sampled_texts(texts, 100, seed=0), sampled_texts(texts, 1000, seed=0)
    assert long[: len(short)] == short and sum(map(len, short)) >= 100 and short != sampled_texts(texts, 100, seed=1)


def test_the_budget_trend_solves_a_power_law_for_the_tokens_at_the_target_and_none_when_it_does_not_fall():
    tokens = np.array([1_000, 2_000, 4_000])
    falling = pd.DataFrame({"method": "kd-lora", "top_k": np.nan, "tokens": tokens,
                            "ratio": 1 + 0.8 * (tokens / 1e3) ** -0.5})
    assert tokens_for(falling, "kd-lora", 1.15) == pytest.approx(1e3 * (0.8 / 0.15) ** 2, rel=1e-6)
    flat = falling.assign(ratio=1.5)
    assert tokens_for(flat, "kd-lora", 1.15) is None


def test_the_settings_study_picks_per_method_what_is_best_over_all_models_counting_each_model_the_same():
    rows = [("a", "lora", 5e-4, 0.0, 100, 90), ("b", "lora", 5e-4, 0.0, 10, 6),   # log-ratio sum -0.62
            ("a", "lora", 2e-3, 0.0, 100, 60), ("b", "lora", 2e-3, 0.0, 10, 9.9),  # -0.52: a alone would pick it
            ("a", "kd-lora", 2e-3, 0.0, 100, 80), ("b", "kd-lora", 2e-3, 0.0, 10, 8),
            ("a", "kd-lora", 2e-3, 1.0, 100, 70), ("b", "kd-lora", 2e-3, 1.0, 10, 7)]
    table = pd.DataFrame(rows, columns=["model", "method", "learning_rate", "next_token_weight", "before",
                                        "perplexity"])
    best = best_settings(table).set_index("method")
    assert best.loc["lora", "learning_rate"] == 5e-4
    assert (best.loc["kd-lora", "learning_rate"], best.loc["kd-lora", "next_token_weight"]) == (2e-3, 1.0)
