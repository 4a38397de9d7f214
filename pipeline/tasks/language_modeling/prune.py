"""What only the prune stage does for language models: the importance curve again with every pruned model refitted by
least squares (pipeline/methods/width/compensation.py) on the width stage's calibration windows, beside the same
heads zeroed, so the paper's unit shows what compensation adds with no retraining."""

from __future__ import annotations

import pandas as pd

from pipeline.core.importance import HeadChoice
from pipeline.core.sites import attention_sites
from pipeline.files.schema import IMPORTANCE_REFIT
from pipeline.methods.pruning import CurveEvaluator, plans_from_order
from pipeline.run.experiment import Experiment
from pipeline.tasks.language_modeling.width import refitting


def refit_curve(exp: Experiment, evaluator: CurveEvaluator, order: list, counts: list[int], choice: HeadChoice
                ) -> list[pd.DataFrame]:
    """With prune.refit: `order`'s pruned models at `counts` heads removed, each refitted (`IMPORTANCE_REFIT`)."""
    if not exp.params.prune.refit:
        return []
    sites = attention_sites(evaluator.model)
    return [evaluator.curve(IMPORTANCE_REFIT, plans_from_order(order, sites, counts, choice),
                            compensate=refitting(exp, evaluator.model))]
