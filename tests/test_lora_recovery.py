"""Recovery fine-tuning of pruned language models: LoRA adapters (pipeline/tasks/language_modeling/lora.py)
trained by the one training loop and merged back, and full fine-tuning through the same loop
(pipeline/tasks/language_modeling/training.py). Models are tiny random decoder-only models built from configs,
pruned unequally per layer (one layer emptied)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from peft.tuners.tuners_utils import BaseTunerLayer

from pipeline.core.checkpoint import load_model, save_model
from pipeline.core.sites import attention_sites, ffn_sites
from pipeline.core.surgery import prune_heads, prune_neurons
from pipeline.tasks.language_modeling.lora import lora_adapters, lora_target_names
from pipeline.tasks.language_modeling.training import RecoveryConfig, recover_language_model, train_language_model
from tests.tiny_models import GQA, LM_FAMILIES, PAD, VOCAB, logits, randomize_biases, tiny_batch, tiny_model

# A large learning rate and no warm-up, so a few steps of a tiny model move its loss clearly.
FAST = dict(steps=12, batch_size=8, learning_rate=1e-2, warmup_steps=0, rank=4, alpha=8.0, dropout=0.0)


def unpruned(family: str = "llama") -> torch.nn.Module:
    """The tiny model that `pruned` prunes (the teacher of distillation's tests).

    Its weights are drawn at std 0.1, not Hugging Face's 0.02: at 0.02 a 32-wide random model's frozen weights
    pass so little of an adapter's change on to the logits that LoRA barely moves its loss in a few steps."""
    model = randomize_biases(tiny_model(family))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.copy_(0.1 * torch.randn(param.shape, generator=generator))
    return model


def pruned(family: str = "llama") -> torch.nn.Module:
    """A tiny model pruned unequally: layer 0 loses heads, layer 1 all of them, layer 2 some; FFN neurons too."""
    model = unpruned(family)
    sites = attention_sites(model)
    if family in GQA:  # whole key/value groups or the same number of query heads from each
        plan = {0: [group[0] for group in sites[0].head_groups], 1: list(range(sites[1].num_heads)),
                2: sites[2].head_groups[0]}
    else:
        plan = {0: [1], 1: list(range(sites[1].num_heads)), 2: [0, 2]}
    return prune_neurons(prune_heads(model, plan), {0: [1, 2], 2: [0]})


def sequences(n: int = 64, seed: int = 0) -> list[list[int]]:
    """Counting runs (each token the one before plus a step), so the next token is learnable from the context."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        start, step, length = rng.integers(2, VOCAB), rng.integers(1, 4), rng.integers(8, 16)
        rows.append([int(2 + (start + step * i) % 8) for i in range(length)])
    return rows


def shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {name: tuple(param.shape) for name, param in model.named_parameters()}


def test_lora_recovery_lowers_the_training_loss_of_a_pruned_llama():
    losses = recover_language_model(pruned(), sequences(), PAD, RecoveryConfig(**FAST), progress=False)
    assert len(losses) == FAST["steps"]
    assert np.mean(losses[-3:]) < 0.9 * np.mean(losses[:3])


def test_lora_adapts_every_attention_and_ffn_linear_but_those_pruning_emptied():
    targets = lora_target_names(pruned("llama"))
    attention = [f"model.layers.{i}.self_attn.{p}_proj" for i in (0, 2) for p in "qkvo"]  # layer 1 was emptied
    ffn = [f"model.layers.{i}.mlp.{p}_proj" for i in range(3) for p in ("up", "gate", "down")]
    assert targets == attention + ffn


@pytest.mark.parametrize("family", LM_FAMILIES)
def test_merged_model_computes_what_the_adapted_one_did_with_no_peft_modules_and_the_same_shapes(family):
    model = pruned(family)
    before, count = shapes(model), sum(p.numel() for p in model.parameters())
    modules = [site.module for site in attention_sites(model)] + [linear for site in ffn_sites(model)
                                                                  for linear in (*site.inputs, site.fc_out)]
    batch = tiny_batch(family)
    cfg = RecoveryConfig(**FAST)
    with lora_adapters(model, cfg.rank, cfg.alpha, cfg.dropout, cfg.seed) as adapted:
        train_language_model(adapted, sequences(), PAD, cfg.train_config(), progress=False)
        adapted_logits = logits(adapted, batch)
    assert not any(isinstance(m, BaseTunerLayer) or "lora" in name for name, m in model.named_modules())
    assert not hasattr(model, "peft_config")
    assert shapes(model) == before and sum(p.numel() for p in model.parameters()) == count
    assert all(param.requires_grad for param in model.parameters())
    # The very module objects, so the attributes pruning left on them (kept_heads, kept_neurons) are still there.
    assert [site.module for site in attention_sites(model)] + [linear for site in ffn_sites(model)
                                                               for linear in (*site.inputs, site.fc_out)] == modules
    torch.testing.assert_close(logits(model, batch), adapted_logits, atol=1e-5, rtol=1e-5)


def test_merged_model_round_trips_through_save_and_load_with_its_pruned_heads_and_equal_logits(tmp_path):
    model = pruned()
    recover_language_model(model, sequences(), PAD, RecoveryConfig(**FAST), progress=False)
    save_model(model, tmp_path / "recovered")
    loaded = load_model(tmp_path / "recovered")
    assert [s.kept_heads for s in attention_sites(loaded)] == [s.kept_heads for s in attention_sites(model)]
    assert [s.kept_neurons for s in ffn_sites(loaded)] == [s.kept_neurons for s in ffn_sites(model)]
    batch = tiny_batch("llama")
    assert torch.equal(logits(loaded, batch), logits(model, batch))


def test_lora_training_changes_only_the_adapters_and_merging_changes_only_the_adapted_weights():
    model = pruned()
    start = {name: param.detach().clone() for name, param in model.named_parameters()}
    cfg = RecoveryConfig(**FAST)
    with lora_adapters(model, cfg.rank, cfg.alpha, cfg.dropout, cfg.seed) as adapted:
        lora_start = {n: p.detach().clone() for n, p in adapted.named_parameters() if "lora_" in n}
        train_language_model(adapted, sequences(), PAD, cfg.train_config(), progress=False)
        trained = dict(adapted.named_parameters())
        assert {n for n, p in trained.items() if p.requires_grad} == set(lora_start)
        assert all(torch.equal(p, model.get_parameter(n)) for n, p in start.items()), "a base weight moved"
        assert all(not torch.equal(trained[n], p) for n, p in lora_start.items() if "lora_B" in n)
    adapted_weights = {f"{name}.weight" for name in lora_target_names(model)}
    changed = {name for name, param in model.named_parameters() if not torch.equal(param, start[name])}
    assert changed == adapted_weights


def test_the_same_seed_gives_the_same_losses_and_another_seed_other_losses():
    runs = [recover_language_model(pruned(), sequences(), PAD, RecoveryConfig(**FAST, seed=seed), progress=False)
            for seed in (0, 0, 1)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_full_recovery_is_the_training_loop_over_every_weight():
    cfg = RecoveryConfig(**{**FAST, "learning_rate": 1e-3}, method="full")
    model, twin = pruned(), pruned()
    start = {name: param.detach().clone() for name, param in model.named_parameters()}
    losses = recover_language_model(model, sequences(), PAD, cfg, progress=False)
    assert losses == train_language_model(twin, sequences(), PAD, cfg.train_config(), progress=False)
    assert np.mean(losses[-3:]) < np.mean(losses[:3])
    # Every weight moved but those of the emptied attention: its projections are zero wide, and the norm in front
    # of it feeds nothing.
    unchanged = {name for name, param in model.named_parameters() if param.numel() and torch.equal(param, start[name])}
    assert unchanged == {"model.layers.1.input_layernorm.weight"}


def test_a_failure_while_adapted_leaves_the_model_as_it_was():
    model = pruned()
    start = {name: param.detach().clone() for name, param in model.named_parameters()}
    with pytest.raises(RuntimeError, match="interrupted"), lora_adapters(model, 4, 8.0, 0.0, 0) as adapted:
        train_language_model(adapted, sequences(), PAD, RecoveryConfig(**FAST).train_config(), progress=False)
        raise RuntimeError("interrupted")
    assert not any(isinstance(m, BaseTunerLayer) for m in model.modules())
    assert all(torch.equal(param, start[name]) and param.requires_grad for name, param in model.named_parameters())


@pytest.mark.parametrize("bad, message", [
    (dict(method="qlora"), "method must be one of lora, full"),
    (dict(rank=0), "rank >= 1"),
    (dict(dropout=1.0), "dropout < 1"),
])
def test_bad_recovery_settings_are_refused_in_one_line(bad, message):
    with pytest.raises(ValueError, match=message):
        RecoveryConfig(**bad)
