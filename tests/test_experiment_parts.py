"""Specification of the pieces the classification stages compose: params validation, evaluation batching,
ablation with replayed lower layers, pruning curves and memory accounting."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from datasets import Dataset

from pipeline.config.params import ParamsError, load_params, parse_params
from pipeline.core.gates import head_gates
from pipeline.core.importance import HeadChoice, random_order
from pipeline.core.sites import attention_sites, layer_stack
from pipeline.data.evaluation import ClassificationEval, make_eval_set, predict
from pipeline.data.metrics import compute_metric
from pipeline.methods.ablation import ablation_tables, record_block_outputs, replay_blocks_below
from pipeline.methods.bench import forward_memory_mb
from pipeline.methods.pruning import (
    CurveEvaluator,
    mean_over_seeds,
    plans_from_order,
    pruned_copy,
    pruning_levels,
    reestimated_plans,
)
from tests.tiny_models import tiny_model


class PadTokenizer:
    """Just enough tokenizer for DataCollatorWithPadding."""

    pad_token_id = 0
    padding_side = "right"
    model_input_names = ["input_ids", "attention_mask"]

    def pad(self, features, **kwargs):
        width = max(len(f["input_ids"]) for f in features)
        ids = torch.tensor([f["input_ids"] + [0] * (width - len(f["input_ids"])) for f in features])
        out = {"input_ids": ids, "attention_mask": (ids != 0).long()}
        if "labels" in features[0]:
            out["labels"] = torch.tensor([f["labels"] for f in features])
        return out


def tiny_dataset(n: int = 40, seed: int = 0) -> Dataset:
    g = np.random.default_rng(seed)
    ids = [g.integers(3, 96, size=g.integers(3, 12)).tolist() for _ in range(n)]
    return Dataset.from_dict({"input_ids": ids, "labels": g.integers(0, 3, size=n).tolist()})


# --- params ------------------------------------------------------------------------------------------


def test_the_shipped_params_files_are_valid():
    params = load_params("params.yaml")
    assert params.task == "classification" and params.prune.step == 0.1 and params.model.name_or_path == "default"
    mt = load_params("mt/params.yaml")
    assert mt.task == "translation" and mt.model.name_or_path == "scratch" and mt.prune.by_kind
    assert mt.model.backend == "hf"
    wmt = load_params("mt-fairseq/params.yaml")
    assert wmt.model.backend == "fairseq" and wmt.model.checkpoint.endswith("model.pt") and wmt.model.trust_checkpoint
    assert wmt.benchmark.attn_implementations == ["eager"]  # fairseq's only attention, unless told otherwise


@pytest.mark.parametrize(
    "raw,message",
    [
        ({"prune": {"stepp": 0.1}}, r"prune.stepp: unknown key; allowed here: step, max_fraction"),
        ({"prune": {"step": 0}}, r"prune.step: Input should be greater than 0 \(got 0\)"),
        ({"model": {"attn_implementation": "flash"}}, r"model.attn_implementation: Input should be 'sdpa' or 'eager'"),
        ({"data": {"fractions": [0.5, 0.5, 0.5]}}, r"data.fractions: .*summing to 1"),
        ({"experiment": "../x"}, r"experiment: String should match pattern"),
        ({"task": "summarization"}, r"task: unknown task 'summarization'; allowed: classification, translation"),
        ({"task": "translation", "translate": {"beams": 4}},
         r"translate.beams: unknown key; allowed here: num_beams, sweep_num_beams"),
        ({"task": "translation", "model": {"d_model": 100, "heads": 8}}, r"must be divisible by heads"),
        ({"task": "translation", "finetune": {"steps": 100, "checkpoint_steps": [100]}},
         r"checkpoint_steps: \[100\] must lie strictly between 0 and steps=100"),
        ({"task": "translation", "model": {"backend": "fairseqq"}},
         r"model.backend: Input should be 'hf' or 'fairseq' \(got 'fairseqq'\)"),
        ({"task": "translation", "model": {"backend": "fairseq", "data_bin": "d"}},
         r"model.checkpoint: required with backend fairseq"),
        ({"task": "translation", "model": {"backend": "fairseq", "checkpoint": "m.pt", "data_bin": "d", "d_model": 64}},
         r"model.d_model: not a setting of backend fairseq; allowed with it: backend, checkpoint, data_bin, "
         r"trust_checkpoint, post_process, detokenize$"),
        ({"task": "translation", "model": {"checkpoint": "m.pt"}},
         r"model.checkpoint: not a setting of backend hf; allowed with it: backend, name_or_path"),
        ({"task": "translation", "model": {"backend": "fairseq", "checkpoint": "m.pt", "data_bin": "d",
                                           "post_process": "bpe"}},
         r"model.post_process: Input should be 'subword_nmt', 'sentencepiece' or 'wordpiece'"),
        ({"task": "translation", "model": {"backend": "fairseq", "checkpoint": "m.pt", "data_bin": "d"},
          "benchmark": {"attn_implementations": ["sdpa"]}},
         r"^invalid params: benchmark.attn_implementations: fairseq models have eager attention only; allowed: "
         r"\[eager\]"),
        ({"task": "translation", "data": {"references": {"test": "ref.txt"}}},
         r"data.references: only with model.backend fairseq"),
    ],
)
def test_bad_params_fail_in_one_line_naming_the_key(raw, message):
    with pytest.raises(ParamsError, match=message) as error:
        parse_params(raw)
    assert "\n" not in str(error.value)


# --- evaluation --------------------------------------------------------------------------------------


def test_predictions_come_back_in_the_original_order_whatever_the_batching():
    model, data = tiny_model("bert"), tiny_dataset()
    one_by_one = predict(model, make_eval_set(data, PadTokenizer(), batch_size=1))
    batched = predict(model, make_eval_set(data, PadTokenizer(), batch_size=16))
    assert np.array_equal(one_by_one, batched)


# --- ablation ----------------------------------------------------------------------------------------


def test_replaying_lower_layers_gives_the_same_predictions_as_running_them():
    model, eval_set = tiny_model("bert"), make_eval_set(tiny_dataset(), PadTokenizer(), batch_size=8)
    stack = layer_stack(model, "encoder")
    with head_gates(model) as gates:
        gates[1][2] = 0.0
        expected = predict(model, eval_set)
        outputs = record_block_outputs(model, stack[0], eval_set.batches)
        stack[0].forward = None  # the replay must not run block 0 at all
        with replay_blocks_below(model, stack, 1, outputs):
            replayed = predict(model, eval_set)
        del stack[0].forward
    assert len(outputs) == len(eval_set.batches)
    assert np.array_equal(expected, replayed)


def test_perplexity_ablation_replays_the_layers_below_and_gives_the_tables_of_running_every_layer():
    from pipeline.methods.ablation import one_group_table
    from pipeline.tasks.language_modeling.perplexity import LanguageModelEval
    from tests.tiny_models import tiny_batch

    model = tiny_model("llama")
    sequences = [ids[ids != 0].tolist() for ids in tiny_batch("llama", batch_size=6, padded=False)["input_ids"]]
    replayed = LanguageModelEval(sequences, pad_id=0, batch_size=4)

    class RunEveryLayer(LanguageModelEval):  # the same evaluation, without the inputs that the replay needs
        model_inputs = None

    full = RunEveryLayer(sequences, pad_id=0, batch_size=4)
    calls = []
    # Layer 0's attention runs only when layer 0 does: a replayed layer returns its recorded output instead.
    handle = layer_stack(model, "decoder")[0].self_attn.register_forward_hook(lambda *_: calls.append(1))
    tables = ablation_tables(model, replayed, n_resamples=100, progress=False)
    layer_0_calls, calls[:] = len(calls), []
    expected = ablation_tables(model, full, n_resamples=100, progress=False)
    handle.remove()
    assert layer_0_calls < len(calls)  # the replay skipped layer 0 for every site above it
    for got, want in zip(tables, expected, strict=True):
        pd.testing.assert_frame_equal(got, want)
    pd.testing.assert_frame_equal(one_group_table(model, replayed, progress=False),
                                  one_group_table(model, full, progress=False))


def test_ablation_tables_match_masking_each_head_by_hand():
    model, eval_set = tiny_model("bert", seed=3), make_eval_set(tiny_dataset(60), PadTokenizer(), batch_size=16)
    ablation, one_head = ablation_tables(model, ClassificationEval(eval_set, "accuracy"), n_resamples=200,
                                         progress=False)
    base = compute_metric("accuracy", predict(model, eval_set), eval_set.labels)
    assert list(ablation.columns) == ["kind", "layer", "head", "metric", "delta", "p_value"]
    assert len(ablation) == 8 and list(one_head.columns) == ["kind", "layer", "best_head", "metric", "delta"]
    with head_gates(model) as gates:
        gates[1][3] = 0.0
        masked = compute_metric("accuracy", predict(model, eval_set), eval_set.labels)
        gates[1][:] = torch.tensor([0.0, 0.0, 1.0, 0.0])
        only_2 = compute_metric("accuracy", predict(model, eval_set), eval_set.labels)
    row = ablation[(ablation.layer == 1) & (ablation["head"] == 3)].iloc[0]
    assert row.metric == pytest.approx(masked) and row.delta == pytest.approx(masked - base)
    assert ((ablation.p_value > 0) & (ablation.p_value <= 1)).all()
    assert one_head.loc[one_head.layer == 1, "metric"].iloc[0] >= only_2


# --- pruning curves ----------------------------------------------------------------------------------


def test_levels_step_up_to_the_maximum_inclusive():
    assert pruning_levels(0.1, 0.9) == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    assert pruning_levels(0.25, 0.6) == [0.0, 0.25, 0.5]


def test_curve_evaluates_each_distinct_plan_once_and_reports_flops_removed():
    model = tiny_model("bert")
    eval_sets = {"dev": make_eval_set(tiny_dataset(30, 1), PadTokenizer(), 8),
                 "test": make_eval_set(tiny_dataset(30, 2), PadTokenizer(), 8)}
    evaluator = CurveEvaluator(model, {s: ClassificationEval(es, "accuracy") for s, es in eval_sets.items()},
                               {k: v[:2] for k, v in eval_sets["dev"].batches[0].items()})
    order = random_order([4, 4], seed=0)
    sites = attention_sites(model)
    curve = evaluator.curve("random", plans_from_order(order, sites, [0, 2, 4, 8]), progress=False)
    assert list(curve.columns) == ["method", "split", "fraction_pruned", "heads_pruned", "metric",
                                   "fraction_flops_removed", "examples"]
    assert set(curve.examples) == {30}
    assert curve.fraction_pruned.tolist() == [0, 0, 0.25, 0.25, 0.5, 0.5, 1.0, 1.0]
    removed = curve.fraction_flops_removed.to_numpy()
    assert removed[0] == 0 and np.all(np.diff(removed[::2]) > 0)
    evaluator.curve("again", plans_from_order(order, sites, [0, 2]), progress=False)
    assert len(evaluator._cache) == 4


def test_reestimated_plans_grow_cumulatively_and_are_deterministic():
    model = tiny_model("bert")
    data = tiny_dataset(24)
    batches = [{"input_ids": torch.tensor([ids[:3] for ids in data["input_ids"][:8]]),
                "labels": torch.tensor(data["labels"][:8])}]
    keep_one = HeadChoice(min_heads_per_site=1)
    plans = list(reestimated_plans(model, batches, [0, 2, 5, 6], normalize_p=2.0, choice=keep_one))
    again = list(reestimated_plans(model, batches, [0, 2, 5, 6], normalize_p=2.0, choice=keep_one))
    assert plans == again
    sizes = [sum(len(h) for h in p.values()) for p in plans]
    assert sizes == [0, 2, 5, 6]
    for before, after in zip(plans, plans[1:], strict=False):
        assert all(set(before.get(s, [])) <= set(after.get(s, [])) for s in before)
    assert all(len(h) <= 3 for p in plans for h in p.values())


def test_reestimated_plans_cannot_break_the_minimum_per_site():
    model = tiny_model("bert")
    batches = [{"input_ids": torch.randint(3, 96, (4, 5)), "labels": torch.tensor([0, 1, 2, 0])}]
    with pytest.raises(ValueError, match="keeping 1 per layer"):
        list(reestimated_plans(model, batches, [0, 7], normalize_p=2.0, choice=HeadChoice(min_heads_per_site=1)))


def test_random_baseline_is_the_mean_over_seeds_with_its_spread():
    a = pd.DataFrame(dict(method="random", split="dev", fraction_pruned=[0, 0.5], heads_pruned=[0, 4],
                          metric=[80.0, 70.0], fraction_flops_removed=[0, 0.1], examples=50))
    b = a.assign(metric=[80.0, 60.0])
    mean = mean_over_seeds([a, b], "random")
    assert mean.metric.tolist() == [80.0, 65.0]
    assert mean.metric_std.iloc[1] == pytest.approx(np.std([70, 60], ddof=1))


# --- memory ------------------------------------------------------------------------------------------


def test_forward_memory_is_exact_and_shrinks_with_the_heads_removed():
    model = tiny_model("bert", attn_implementation="eager")
    inputs = {"input_ids": torch.randint(3, 96, (16, 32))}
    full = forward_memory_mb(model, inputs)
    assert full == forward_memory_mb(model, inputs)  # allocator accounting, not the noisy resident set
    weights = sum(p.numel() * 4 for p in model.parameters()) + sum(b.numel() * b.element_size()
                                                                     for b in model.buffers())
    assert full["weights_mb"] == round(weights / 2**20, 2)
    pruned = forward_memory_mb(pruned_copy(model, {0: [0, 1], 1: [2, 3]}), inputs)
    # Eager attention materialises [batch, heads, seq, seq] scores: half the heads, smaller peak.
    assert pruned["weights_mb"] < full["weights_mb"] and 0 < pruned["activations_mb"] < full["activations_mb"]
