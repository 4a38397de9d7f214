"""FFN neurons of fairseq Transformers: the guarantees of tests/test_ffn_surgery.py on a time-major model.

fairseq runs its layers on `[time, batch, channels]`, so per-example neuron gates must broadcast along dim 1;
the finite-difference check of per-example gates is what shows they do. The model is a tiny random
`TransformerModel` built from arguments (nothing here needs it trained). Needs the `fairseq` extra; CI installs
it, so there these tests always run.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import os
import types

import pytest
import torch
import torch.nn.functional as F

# Skip where the `fairseq` extra is absent, but not in CI, which installs it. The check does not import fairseq:
# only the backend may, since it undoes what that import does to logging.
if importlib.util.find_spec("fairseq") is None:
    if os.environ.get("CI"):
        raise ImportError("CI must install the fairseq extra (make setup) so that tests/test_fairseq_ffn.py runs")
    pytest.skip("the fairseq extra is not installed", allow_module_level=True)

from pipeline.core.checkpoint import apply_pruning_record, check_pruned_shapes, pruning_record  # noqa: E402
from pipeline.core.flops import forward_flops, parameter_count  # noqa: E402
from pipeline.core.gates import head_gates, neuron_gates  # noqa: E402
from pipeline.core.importance import per_example_loss  # noqa: E402
from pipeline.core.sites import UnsupportedModelError, ffn_sites  # noqa: E402
from pipeline.core.surgery import prune_heads, prune_neurons  # noqa: E402
from pipeline.tasks.translation import fairseq as fb  # noqa: E402
from tests.tiny_models import randomize_biases  # noqa: E402

# isort: split
# After the backend, which imports fairseq with the logging configuration kept as it was.
from fairseq.data import Dictionary  # noqa: E402
from fairseq.models.transformer import TransformerModel, base_architecture  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

NEURONS, HIDDEN, WORDS = 37, 32, 20
# Heads as in tests/test_fairseq.py (a site of each kind emptied); neurons: one block emptied in each stack, in
# layers that keep some heads, and different counts elsewhere.
HEADS = {0: [1, 2], 1: [0, 1, 2, 3], 2: [0, 1, 2, 3], 3: [3], 4: [1], 5: [0, 1, 2, 3]}
NEURON_PLAN = {0: list(range(NEURONS)), 1: list(range(0, NEURONS, 3)), 2: [5, 6, 36], 3: list(range(NEURONS))}


def tiny_fairseq(seed: int = 0, **overrides) -> fb.FairseqSeq2Seq:
    dictionary = Dictionary()
    for i in range(WORDS):
        dictionary.add_symbol(f"w{i}")
    # Unset options take fairseq's `transformer` defaults from base_architecture.
    args = argparse.Namespace(encoder_layers=2, decoder_layers=2, encoder_embed_dim=HIDDEN, decoder_embed_dim=HIDDEN,
                              encoder_ffn_embed_dim=NEURONS, decoder_ffn_embed_dim=NEURONS, encoder_attention_heads=4,
                              decoder_attention_heads=4, share_all_embeddings=True, max_source_positions=64,
                              max_target_positions=64, **overrides)
    base_architecture(args)
    task = types.SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    torch.manual_seed(seed)
    model = TransformerModel.build_model(args, task)
    return randomize_biases(fb.FairseqSeq2Seq(model, OmegaConf.create({}), dictionary, dictionary))


@pytest.fixture
def model() -> fb.FairseqSeq2Seq:
    return tiny_fairseq()


def sentences(model, count: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    first, eos = model.tgt_dict.nspecial, model.config.eos_token_id
    lengths = torch.randint(3, 9, (count,), generator=g).tolist()
    return [torch.cat([torch.randint(first, first + WORDS, (n,), generator=g), torch.tensor([eos])]) for n in lengths]


@pytest.fixture
def batch(model) -> dict[str, torch.Tensor]:
    """Five pairs of different lengths (none 5 long, so time and batch cannot be confused), both sides padded."""
    return fb.labelled_batches(model, sentences(model, 5, seed=1), sentences(model, 5, seed=2), batch_size=5)[0]


def logits(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).logits


def central_difference(loss, gate: torch.Tensor, index: tuple, eps: float = 1e-4) -> torch.Tensor:
    with torch.no_grad():
        gate[index] += eps
        up = loss()
        gate[index] -= 2 * eps
        down = loss()
        gate[index] += eps
    return (up - down) / (2 * eps)


def test_ffn_sites_are_the_encoder_then_decoder_blocks_with_time_major_batches(model, batch):
    sites = ffn_sites(model)
    assert [(s.name, s.num_neurons, s.batch_dim) for s in sites] == [
        ("encoder layer 0 FFN", 37, 1), ("encoder layer 1 FFN", 37, 1),
        ("decoder layer 0 FFN", 37, 1), ("decoder layer 1 FFN", 37, 1)]
    assert batch["input_ids"].shape[0] not in (batch["input_ids"].shape[1], batch["labels"].shape[1])


def test_neuron_gates_at_one_are_bit_identical_and_a_zero_gate_changes_every_sites_output(model, batch):
    reference = logits(model, batch)
    with neuron_gates(model) as gates:
        assert torch.equal(logits(model, batch), reference)
        for site in range(len(gates)):
            gates[site][5] = 0.0
            assert not torch.allclose(logits(model, batch), reference), f"site {site}"
            gates[site][5] = 1.0
    assert torch.equal(logits(model, batch), reference)


def test_neuron_gate_gradients_match_float64_finite_differences_shared_and_per_example(model, batch, monkeypatch):
    # fairseq takes the attention softmax in float32 whatever the model's dtype; keep it in float64 here.
    monkeypatch.setattr("fairseq.utils.softmax", lambda x, dim, onnx_trace=False: F.softmax(x, dim=dim))
    model = copy.deepcopy(model).double()

    def loss() -> torch.Tensor:
        return per_example_loss(model, batch).sum()

    with neuron_gates(model, requires_grad=True) as gates:
        loss().backward()
        for site, gate in zip(ffn_sites(model), gates, strict=True):
            numeric = torch.stack([central_difference(loss, gate, (n,)) for n in range(NEURONS)])
            assert gate.grad.abs().max() > 0, f"{site.name}: no gradient"  # (a ReLU neuron may be dead)
            assert (gate.grad - numeric).norm() / numeric.norm() <= 1e-5, site.name
    size = batch["labels"].shape[0]
    with neuron_gates(model) as gates:
        leaves = gates.per_example(size)
        loss().backward()
        indices = [(b, n) for b in range(size) for n in (0, 17, 36)]
        for site, leaf in zip(ffn_sites(model), leaves, strict=True):
            numeric = torch.stack([central_difference(loss, leaf, index) for index in indices])
            analytic = torch.stack([leaf.grad[index] for index in indices])
            assert (analytic - numeric).norm() / numeric.norm() <= 1e-5, site.name


def test_pruned_outputs_and_generations_equal_the_gated_model_with_heads_and_neurons_pruned(model, batch):
    sources = sentences(model, 12, seed=3)
    with head_gates(model) as h_gates, neuron_gates(model) as n_gates:
        for gates, plan in ((h_gates, HEADS), (n_gates, NEURON_PLAN)):
            for site, units in plan.items():
                gates[site][units] = 0.0
        gated = logits(model, batch)
        gated_greedy, gated_beam = fb.generate(model, sources, beam=1), fb.generate(model, sources, beam=4)
    prune_heads(model, HEADS)
    params, flops = parameter_count(model), forward_flops(model, batch)
    prune_neurons(model, NEURON_PLAN)
    assert [s.num_neurons for s in ffn_sites(model)] == [0, 24, 34, 0]
    assert (logits(model, batch) - gated).abs().max() <= 1e-5
    for beam, expected in ((1, gated_greedy), (4, gated_beam)):
        for pruned, reference in zip(fb.generate(model, sources, beam=beam), expected, strict=True):
            assert torch.equal(pruned["tokens"], reference["tokens"])
            assert (pruned["positional_scores"] - reference["positional_scores"]).abs().max() <= 1e-5
    removed = {i: len(plan) for i, plan in NEURON_PLAN.items()}
    assert params - parameter_count(model) == sum(removed.values()) * (2 * HIDDEN + 1)
    tokens = {"encoder": batch["input_ids"].numel(), "decoder": batch["labels"].numel()}
    assert flops - forward_flops(model, batch) == sum(
        4 * HIDDEN * removed[i] * tokens[s.kind] for i, s in enumerate(ffn_sites(model)))


def test_a_pruning_record_rebuilds_the_pruned_model_from_a_fresh_one(model, batch):
    prune_neurons(prune_heads(model, HEADS), NEURON_PLAN)
    record, weights = pruning_record(model), model.model.state_dict()
    unpruned = tiny_fairseq(seed=1)
    with pytest.raises(fb.CorruptCheckpointError, match=r"ckpt: site 0 \(encoder layer 0\) records 4 heads"):
        check_pruned_shapes(unpruned, weights, "ckpt", root=unpruned.model, error=fb.CorruptCheckpointError)
    fresh = apply_pruning_record(tiny_fairseq(seed=1), record, "ckpt")
    assert pruning_record(fresh) == record
    check_pruned_shapes(fresh, weights, "ckpt", root=fresh.model, error=fb.CorruptCheckpointError)
    fresh.model.load_state_dict(weights, strict=True)
    assert torch.equal(logits(fresh, batch), logits(model, batch))


def test_normformer_feed_forward_blocks_are_refused():
    # --scale-fc puts a LayerNorm over the decoder's intermediate activations, coupling its neurons.
    with pytest.raises(UnsupportedModelError, match=r"decoder layer 0: .*LayerNorm inside"):
        ffn_sites(tiny_fairseq(scale_fc=True))
