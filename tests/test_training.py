"""The optimiser and optimisation step both tasks train with: decay on matrices only, one step in a fixed order."""

from __future__ import annotations

import torch

from pipeline.training.optim import adamw, train_step
from tests.tiny_models import tiny_batch, tiny_model


def test_adamw_decays_trainable_matrices_only_and_keeps_the_model_order_in_each_group():
    for family in ("bert", "marian"):
        model = tiny_model(family)
        optimizer = adamw(model, lr=1e-3, weight_decay=0.01)
        names = {id(p): n for n, p in model.named_parameters()}
        decayed, plain = ([names[id(p)] for p in g["params"]] for g in optimizer.param_groups)
        order = [n for n, p in model.named_parameters() if p.requires_grad]  # Marian's sinusoidal positions are not
        assert decayed == [n for n in order if n in decayed] and plain == [n for n in order if n in plain]
        assert sorted(decayed + plain) == sorted(order)
        params = dict(model.named_parameters())
        assert all(params[n].dim() > 1 for n in decayed)
        assert any("LayerNorm" in n or "layer_norm" in n for n in plain) and all(params[n].dim() == 1 for n in plain)
        assert [g["weight_decay"] for g in optimizer.param_groups] == [0.01, 0.0]


def test_train_step_clips_steps_the_schedule_and_clears_the_gradients():
    model = tiny_model("bert").train()
    optimizer = adamw(model, lr=1e-3, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (s + 1))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    norms = []
    real_clip = torch.nn.utils.clip_grad_norm_
    torch.nn.utils.clip_grad_norm_ = lambda params, max_norm: norms.append(max_norm) or real_clip(params, max_norm)
    try:
        loss = model(**tiny_batch("bert")).loss
        assert train_step(loss, model, optimizer, scheduler, max_grad_norm=0.5) == loss.item()
    finally:
        torch.nn.utils.clip_grad_norm_ = real_clip
    assert norms == [0.5]
    assert scheduler.get_last_lr() == [5e-4, 5e-4]
    assert all(p.grad is None for p in model.parameters())
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
