"""Specification of the fairseq backend, on a real fairseq model trained here.

A tiny Transformer (embed 32, 2+2 layers, 4 heads, FFN 64) is trained with the `fairseq-preprocess` and
`fairseq-train` command-line tools on a generated toy translation task (reverse the sentence and map each
word to its target word; tests/fairseq_toy.py, trained once per session by conftest.py), then loaded with
`load_checkpoint`. The core's sites, gates, importance, physical
pruning and pruning curves must work on it for all three kinds of attention, and pruned checkpoints must
round-trip. Needs the `fairseq` extra; CI installs it, so there these tests always run.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

# Skip where the `fairseq` extra is absent, but not in CI, which installs it. The check does not import fairseq:
# only the backend may, since it undoes what that import does to logging.
if importlib.util.find_spec("fairseq") is None:
    if os.environ.get("CI"):
        raise ImportError("CI must install the fairseq extra (make setup) so that tests/test_fairseq.py runs")
    pytest.skip("the fairseq extra is not installed", allow_module_level=True)

from pipeline.core.flops import parameter_count  # noqa: E402
from pipeline.core.gates import head_gates  # noqa: E402
from pipeline.core.importance import head_importance, per_example_loss, rank_heads  # noqa: E402
from pipeline.core.sites import attention_sites  # noqa: E402
from pipeline.core.surgery import prune_heads  # noqa: E402
from pipeline.methods.pruning import CurveEvaluator, plans_from_order  # noqa: E402
from pipeline.tasks.translation import fairseq as fb  # noqa: E402

pytestmark = pytest.mark.slow  # trains a fairseq model with fairseq-train

# Every kind touched, with different counts per site, and one site of each kind emptied.
PLAN = {0: [1, 2], 1: [0, 1, 2, 3], 2: [0, 1, 2, 3], 3: [3], 4: [1], 5: [0, 1, 2, 3]}


@pytest.fixture(scope="module")
def trained(fairseq_toy_checkpoint) -> Path:
    """The checkpoint of a tiny fairseq Transformer trained on the toy task (tests/fairseq_toy.py)."""
    return fairseq_toy_checkpoint


@pytest.fixture
def model(trained) -> fb.FairseqSeq2Seq:
    return fb.load_checkpoint(trained, trust_checkpoint=True)


@pytest.fixture
def batch(model) -> dict[str, torch.Tensor]:
    """Five test sentences of different lengths, so source and target padding are both exercised."""
    sources, targets = fb.read_split(model, "test")
    return fb.labelled_batches(model, sources[:5], targets[:5], batch_size=5)[0]


def logits(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).logits


def mask_plan(gates, plan) -> None:
    for site, heads in plan.items():
        gates[site][heads] = 0.0


# --- sites and gates ---------------------------------------------------------------------------------


def test_sites_list_every_attention_module_of_all_three_kinds_in_model_order(model):
    sites = attention_sites(model)
    assert [(s.kind, s.layer) for s in sites] == [
        ("encoder", 0), ("encoder", 1), ("decoder", 0), ("cross", 0), ("decoder", 1), ("cross", 1)]
    assert all(s.num_heads == 4 and s.head_dim == 8 for s in sites)


def test_gates_at_one_leave_outputs_unchanged_and_a_zero_gate_masks_its_head(model, batch):
    reference = logits(model, batch)
    with head_gates(model) as gates:
        assert torch.equal(logits(model, batch), reference)
        for site in range(len(gates)):
            gates[site][1] = 0.0
            assert not torch.allclose(logits(model, batch), reference), f"site {site}"
            gates[site][1] = 1.0
    assert torch.equal(logits(model, batch), reference)


def test_gate_gradients_are_nonzero_and_match_float64_central_finite_differences(model, batch, monkeypatch):
    # fairseq takes the attention softmax in float32 whatever the model's dtype; keep it in float64 here so
    # the finite differences are exact enough to compare.
    monkeypatch.setattr("fairseq.utils.softmax", lambda x, dim, onnx_trace=False: F.softmax(x, dim=dim))
    model = copy.deepcopy(model).double()
    with head_gates(model, requires_grad=True) as gates:
        per_example_loss(model, batch).sum().backward()
        analytic = [g.grad.clone() for g in gates]
        numeric = []
        eps = 1e-6
        with torch.no_grad():
            for gate in gates:
                site = []
                for h in range(gate.shape[0]):
                    gate[h] += eps
                    up = per_example_loss(model, batch).sum()
                    gate[h] -= 2 * eps
                    down = per_example_loss(model, batch).sum()
                    gate[h] += eps
                    site.append((up - down) / (2 * eps))
                numeric.append(torch.stack(site))
    for site, a, n in zip(attention_sites(model), analytic, numeric, strict=True):
        assert a.abs().min() > 0, f"{site.name}: a head got no gradient"
        assert (a - n).norm() / n.norm() <= 1e-6, f"{site.name}: {a} vs {n}"


def test_importance_is_the_mean_over_examples_of_each_examples_absolute_gate_gradient(model, batch):
    # head_importance gives each example its own gates along the batch dimension, which fairseq puts second.
    scores = head_importance(model, [batch], progress=False)
    assert all(p.grad is None for p in model.parameters())  # only the gates' gradients are computed
    expected = torch.zeros(6, 4)
    for i in range(5):
        with head_gates(model, requires_grad=True) as gates:
            per_example_loss(model, {k: v[i : i + 1] for k, v in batch.items()}).sum().backward()
            expected += torch.stack([g.grad for g in gates]).abs()
    assert torch.allclose(torch.stack(scores), expected / 5, rtol=1e-4, atol=1e-7)


# --- physical pruning --------------------------------------------------------------------------------


def test_pruned_outputs_and_generations_equal_the_gated_model(model, batch):
    sources, _ = fb.read_split(model, "test")
    with head_gates(model) as gates:
        mask_plan(gates, PLAN)
        gated = logits(model, batch)
        gated_greedy = fb.generate(model, sources[:20], beam=1)
        gated_beam = fb.generate(model, sources[:20], beam=4)
    params = parameter_count(model)
    prune_heads(model, PLAN)
    assert [s.num_heads for s in attention_sites(model)] == [2, 0, 0, 3, 3, 0]
    assert params - parameter_count(model) == 16 * 8 * (4 * 32 + 3)  # q, k, v rows and biases, out_proj columns
    assert (logits(model, batch) - gated).abs().max() <= 1e-5
    for beam, expected in ((1, gated_greedy), (4, gated_beam)):
        pruned = fb.generate(model, sources[:20], beam=beam)
        for p, g in zip(pruned, expected, strict=True):
            assert torch.equal(p["tokens"], g["tokens"])
            assert (p["positional_scores"] - g["positional_scores"]).abs().max() <= 1e-5


def test_one_pruning_level_by_importance_is_scored_with_bleu(model):
    sources, targets = fb.read_split(model, "test")
    references = [fb.to_text(model, t) for t in targets]
    evaluator = CurveEvaluator(model, {"test": fb.FairseqTranslationEval(sources, references)},
                               fb.labelled_batches(model, sources[:8], targets[:8], batch_size=8)[0])
    valid_sources, valid_targets = fb.read_split(model, "valid")
    scores = head_importance(model, fb.labelled_batches(model, valid_sources, valid_targets), progress=False)
    curve = evaluator.curve("importance", plans_from_order(rank_heads(scores), attention_sites(model), [0, 6]),
                            progress=False)
    unpruned, pruned = curve.to_dict("records")
    assert unpruned["heads_pruned"] == 0 and unpruned["metric"] >= 50.0  # the toy task was learned
    assert pruned["heads_pruned"] == 6 and pruned["fraction_pruned"] == 0.25
    assert 0.0 <= pruned["metric"] <= 100.0 and pruned["fraction_flops_removed"] > 0
    print(f"BLEU unpruned {unpruned['metric']:.2f}, 25% of heads pruned {pruned['metric']:.2f}")


# --- checkpoints -------------------------------------------------------------------------------------


def test_pruned_checkpoint_reloads_with_identical_outputs(model, batch, trained, tmp_path):
    sources, _ = fb.read_split(model, "test")
    prune_heads(model, PLAN)
    fb.save_checkpoint(model, tmp_path / "pruned.pt")
    moved = shutil.copytree(trained.parents[1] / "data-bin", tmp_path / "data-bin")  # dictionaries found anywhere
    loaded = fb.load_checkpoint(tmp_path / "pruned.pt", data_bin=moved, trust_checkpoint=True)
    assert loaded.cfg.task.data == str(moved)
    assert [s.kept_heads for s in attention_sites(loaded)] == [s.kept_heads for s in attention_sites(model)]
    assert torch.equal(logits(loaded, batch), logits(model, batch))
    for a, b in zip(fb.generate(loaded, sources[:10]), fb.generate(model, sources[:10]), strict=True):
        assert torch.equal(a["tokens"], b["tokens"]) and torch.equal(a["positional_scores"], b["positional_scores"])


def test_a_checkpoint_is_not_unpickled_unless_the_caller_trusts_it(trained):
    with pytest.raises(fb.UntrustedCheckpointError, match=r"argparse\.Namespace.*trust_checkpoint=True"):
        fb.load_checkpoint(trained)


@pytest.mark.parametrize("trust", [False, True])
def test_a_truncated_or_garbage_checkpoint_is_reported_as_corrupt(trained, tmp_path, trust):
    truncated, garbage = tmp_path / "truncated.pt", tmp_path / "garbage.pt"
    data = trained.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    garbage.write_bytes(b"not a checkpoint\n" * 100)
    for path in (truncated, garbage):
        with pytest.raises(fb.CorruptCheckpointError, match=rf"{path.name}.*(truncated or corrupt|cannot read)"):
            fb.load_checkpoint(path, trust_checkpoint=trust)
    with pytest.raises(FileNotFoundError, match="no such checkpoint"):
        fb.load_checkpoint(tmp_path / "missing.pt", trust_checkpoint=trust)


def test_importing_the_backend_leaves_other_libraries_logging_alone():
    code = ("import logging; other = logging.getLogger('other'); "
            "import pipeline.tasks.translation.fairseq; "
            "assert logging.getLogger().level == logging.WARNING and not logging.getLogger().handlers; "
            "assert other.getEffectiveLevel() == logging.WARNING")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parents[1])
    assert result.returncode == 0, result.stderr[-2000:]
