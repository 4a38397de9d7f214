"""The pruned models the prune stage saves hold the level their folders name (pipeline/core/levels.py).

Under grouped-query attention heads go in whole units, and `prune.uniform` takes as many from every layer: 9 query
heads in 3 key/value groups lose 0, 3, 6 or 9 heads a layer. A fraction that shape cannot take is refused with the
levels it can take, never rounded into a folder whose name lies, and never saved as the unpruned model.
"""

from __future__ import annotations

import pytest
import torch

from pipeline.core.checkpoint import load_model, save_model
from pipeline.core.importance import HeadChoice
from pipeline.core.levels import AttentionShape, LevelError, heads_to_save, uniform_levels
from pipeline.core.sites import attention_sites
from pipeline.files.schema import pruned_name
from pipeline.methods.pruning import heads_for, pruned_copy, saved_plans
from tests.tiny_gguf import tiny_gqa_llama

SMOLLM2 = AttentionShape.alike(sites=30, heads=9, kv_heads=3)
IDS = torch.tensor([[1, 40, 41, 42, 43, 44, 45, 2]])


@pytest.fixture(scope="module")
def model():
    """3 layers of 9 query heads in 3 key/value groups, head_dim 6 (not hidden / heads)."""
    return tiny_gqa_llama(layers=3)


def random_scores(model) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.rand(site.num_heads, generator=generator) for site in attention_sites(model)]


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


def test_9_query_heads_in_3_groups_take_a_third_or_two_thirds_of_every_layer_and_12_heads_any_twelfth():
    assert uniform_levels(SMOLLM2, "query") == uniform_levels(SMOLLM2, "group") == [3, 6]
    assert uniform_levels(SMOLLM2, "query", min_heads=4) == [3]
    assert uniform_levels(AttentionShape.alike(6, 12), "query") == list(range(1, 12))
    assert heads_to_save(0.333, SMOLLM2, "query", uniform=True) == heads_to_save(0.33, SMOLLM2, "query", True) == 90
    assert heads_to_save(0.25, SMOLLM2, "query", uniform=False) == 68  # not uniform: a quarter, in whole units later


def test_the_count_that_used_to_save_25_percent_removed_no_head_and_is_now_refused(model):
    sites, choice = attention_sites(model), HeadChoice("query", uniform=True)
    order = choice.rank(random_scores(model), sites)
    assert choice.select(order, sites, heads_for(0.25, 27)) == {}  # the bug: pruned/25 was the dense model
    with pytest.raises(LevelError) as error:
        saved_plans(order, sites, [0.33, 0.25], choice, "prune.save_fractions")
    assert str(error.value) == (
        "prune.save_fractions: 0.25 of the heads cannot go alike from 3 attention layers of 9 query heads in 3 "
        "key/value groups, taken in whole units of 3 (one from each group); the levels it can save are 0.333, 0.667")


@pytest.mark.parametrize("unit", ["query", "group"])
def test_uniformly_saved_folders_hold_the_level_their_name_says_and_none_is_the_dense_model(model, unit, tmp_path):
    sites, choice = attention_sites(model), HeadChoice(unit, uniform=True)
    plans = saved_plans(choice.rank(random_scores(model), sites), sites, [0.33, 0.667], choice,
                        "prune.save_fractions")
    dense = logits(model)
    for fraction, plan in plans.items():
        folder = save_model(pruned_copy(model, plan), tmp_path / pruned_name(fraction))
        loaded = load_model(folder).eval()
        kept = [site.num_heads for site in attention_sites(loaded)]
        assert folder.name == pruned_name(1 - sum(kept) / 27)
        assert len(set(kept)) == 1 and kept[0] == {"33": 6, "67": 3}[folder.name]
        assert {site.num_kv_heads for site in attention_sites(loaded)} == {3 if unit == "query" else kept[0] // 3}
        assert not torch.allclose(logits(loaded), dense)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["33", "67"]


def test_a_non_uniform_level_below_one_unit_is_refused_and_one_above_removes_whole_units(model):
    sites, choice = attention_sites(model), HeadChoice("query")
    order = choice.rank(random_scores(model), sites)
    with pytest.raises(LevelError, match="0.05 of 27 heads is 1, less than one unit of 3"):
        saved_plans(order, sites, [0.05], choice, "prune.save_fractions")
    plan = saved_plans(order, sites, [0.25], choice, "prune.save_fractions")[0.25]
    assert sum(map(len, plan.values())) == 6  # 7 heads asked, two whole units of 3 taken


def test_keeping_every_head_a_plan_would_take_is_refused_rather_than_saving_the_dense_model(model):
    sites, choice = attention_sites(model), HeadChoice("group", min_heads_per_site=7)
    with pytest.raises(LevelError, match=r"0.3 removes no head while every layer keeps 7 \(prune.min_heads_per_layer"):
        saved_plans(choice.rank(random_scores(model), sites), sites, [0.3], choice, "prune.save_fractions")


@pytest.mark.parametrize(("shape", "unit"), [
    (SMOLLM2, "query"), (SMOLLM2, "group"), (AttentionShape.alike(6, 12), "query"),
    (AttentionShape.alike(6, 8, 2), "query"), (AttentionShape.alike(24, 15, 5), "group"),
    (AttentionShape.alike(16, 32, 8), "query"), (AttentionShape((12, 12, 6), (12, 12, 6)), "query"),
])
def test_every_level_a_refusal_lists_is_accepted_as_written(shape, unit):
    with pytest.raises(LevelError) as error:
        heads_to_save(0.999, shape, unit, uniform=True)
    for written in str(error.value).rsplit("can save are ", 1)[1].split(", "):
        count = heads_to_save(float(written), shape, unit, uniform=True)
        assert count % len(shape.heads) == 0 and pruned_name(count / shape.total) == pruned_name(float(written))
