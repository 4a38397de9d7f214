"""The language modeling `Task`: what every stage of its pipeline uses (pipeline/run/task.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import datasets
import pandas as pd
import torch
from torch import nn

from pipeline.core.importance import HeadChoice
from pipeline.core.layerwise import LayerwiseModel, layerwise_head_importance, layerwise_token_head_importance
from pipeline.core.placement import load_sharded
from pipeline.core.sites import AttentionSite, attention_sites
from pipeline.files.artifacts import MissingArtifact
from pipeline.files.schema import (
    HEAD_UNITS,
    LANGUAGE_MODELING,
    LAYERWISE,
    OFFLOAD_DIR,
    OTHER_UNIT_CURVE_TABLE,
    SCRATCH,
    TABLE_COLUMNS,
    UNPRUNED_MODEL,
    WHOLE,
    kv_groups_label,
    width_label,
)
from pipeline.methods.pruning import CurveEvaluator, criterion_curves, paper_curves
from pipeline.run.task import Batch, Task
from pipeline.tasks.language_modeling.llama import collate_texts
from pipeline.tasks.language_modeling.perplexity import LanguageModelEval


class LanguageModelingTask(Task):
    name = LANGUAGE_MODELING
    first_token_last_layer = False
    one_group_table = True

    @property
    def trains_from_scratch(self) -> bool:
        """A Llama that the finetune stage trains; any other language model is only evaluated."""
        return self.exp.params.model.name_or_path == SCRATCH

    @property
    def pad_token_id(self) -> int:
        tokenizer = self.exp.tokenizer()
        # Llama's and GPT-2's tokenizers have no pad token. Padding is masked out (attention and labels), so any id
        # will do; eos is one the model knows.
        return tokenizer.eos_token_id if tokenizer.pad_token_id is None else tokenizer.pad_token_id

    def load(self, path: Path) -> nn.Module:
        """A model folder on the runtime's device, or under runtime.placement sharded (or layerwise) across the GPUs,
        the CPU and disk by accelerate within runtime.max_memory (pipeline/core/placement.py): an offloaded layer's
        weights come to the device for its forward only, so the stages that evaluate run layer by layer too."""
        exp = self.exp
        if exp.runtime.placement == WHOLE:
            return super().load(path)
        if not path.is_dir():
            raise MissingArtifact(path)
        return load_sharded(path, exp.runtime, exp.artifacts / OFFLOAD_DIR, exp.trust_remote_code,
                            attn_implementation=exp.params.model.attn_implementation)

    def head_importance(self, path: Path, batches: list[Batch]) -> tuple[list[AttentionSite], list[torch.Tensor]]:
        """runtime.placement layerwise: one decoder layer's weights at a time read from the folder onto the device,
        the layer inputs carried forward on the CPU (pipeline/core/layerwise.py); the same scores as the whole
        model's. Otherwise as every family scores."""
        exp = self.exp
        if exp.runtime.placement != LAYERWISE:
            return super().head_importance(path, batches)
        lm = LayerwiseModel.from_folder(path, exp.runtime.device, trust_remote_code=exp.trust_remote_code,
                                        attn_implementation=exp.params.model.attn_implementation)
        with exp.runtime.autocast():
            raw = (layerwise_token_head_importance(lm, batches)[0] if exp.params.score.estimator == "token"
                   else layerwise_head_importance(lm, batches))
        return lm.sites, raw

    def batches(self, data: datasets.Dataset, batch_size: int) -> list[Batch]:
        # labels == input_ids, -100 on padding: per_example_loss shifts them
        pad, ids = self.pad_token_id, data["input_ids"][:]
        return [collate_texts(ids[i : i + batch_size], pad) for i in range(0, len(ids), batch_size)]

    def evaluation(self, split: str, max_examples: int | None = None) -> LanguageModelEval:
        """Perplexity of `split` (a seeded subset of `max_examples` sequences), in batches of eval.batch_size."""
        exp = self.exp
        data = exp.split(split)
        if max_examples is not None and max_examples < len(data):
            data = data.shuffle(seed=exp.params.seed).select(range(max_examples))
        return LanguageModelEval(data["input_ids"][:], self.pad_token_id, exp.params.eval.batch_size, exp.runtime)

    def saved_models(self) -> dict[str, Path]:
        """The models by label, the unpruned one first: those the prune stage saved (prune.save_fractions in
        prune.unit, prune.kv_group_fractions) and the width stage's (width.save_levels), whose folders the recover,
        zero-shot and benchmark stages read."""
        exp = self.exp
        pp, w = exp.params.prune, exp.params.width
        return {UNPRUNED_MODEL: exp.finetuned_dir,
                **{f"{f:.0%} of heads ({pp.unit})": exp.pruned_dir(f) for f in pp.save_fractions},
                **{kv_groups_label(f): exp.kv_groups_dir(f) for f in pp.kv_group_fractions},
                **{width_label(level, w.budget): exp.width_dir(level) for level in w.save_levels}}

    def headline_model(self) -> tuple[str, float] | None:
        """The label and the fraction of query heads removed of the most pruned saved model, the one benchmark.json
        and zero_shot.json quote (a tie goes to the serving shape, whole key/value groups removed); None: none saved.
        """
        pp = self.exp.params.prune
        saved = [*((f"{f:.0%} of heads ({pp.unit})", f) for f in pp.save_fractions),
                 *((kv_groups_label(f), f) for f in pp.kv_group_fractions)]
        return max(reversed(saved), key=lambda pair: pair[1]) if saved else None

    def extra_curves(self, evaluator: CurveEvaluator, order: list, levels: list[float], counts: list[int],
                     importance: list, choice: HeadChoice, lap: Callable[[str], None]
                     ) -> tuple[list[pd.DataFrame], dict[str, pd.DataFrame]]:
        """The importance curve refitted (the prune stage's `refit_curve`)."""
        curves = self.stage("prune").refit_curve(self.exp, evaluator, order, counts, choice)
        if curves:
            lap("refitted curve")
        return curves, {}

    def extra_tables(self, evaluator: CurveEvaluator, importance: list, criteria: dict, counts: list[int],
                     choice: HeadChoice, lap: Callable[[str], None]) -> dict[str, pd.DataFrame]:
        """With prune.compare_units under grouped-query attention: the importance, random, refitted and criteria
        curves again in the unit that prune.unit is not (empty otherwise)."""
        pp = self.exp.params.prune
        sites = attention_sites(evaluator.model)
        if not pp.compare_units or all(site.original_group_size == 1 for site in sites):
            return {OTHER_UNIT_CURVE_TABLE: pd.DataFrame(columns=TABLE_COLUMNS[OTHER_UNIT_CURVE_TABLE])}
        other = dataclasses.replace(choice, unit=next(unit for unit in HEAD_UNITS if unit != choice.unit))
        order = other.rank(importance, sites)
        curves = paper_curves(evaluator, order, counts, pp.random_seeds, other)
        curves += self.stage("prune").refit_curve(self.exp, evaluator, order, counts, other)
        curves += criterion_curves(evaluator, criteria, counts, other)
        lap("curves in the other unit")
        return {OTHER_UNIT_CURVE_TABLE: pd.concat(curves, ignore_index=True).assign(unit=other.unit)}


TASK = LanguageModelingTask
