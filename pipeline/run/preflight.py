"""Every check that can run before the heavy imports: the params file, and the inputs that the prepare stage reads.

A stage calls `preflight(stage)` first thing, before it imports torch, transformers or datasets (10-15 s here), so
that a mistyped key, path or column gets its line within a second or two, and before anything is written. The
command `python -m pipeline.checks` (run first by `make repro`) runs the same checks and lists every problem at once.
Imports stay light on purpose: yaml, pydantic, numpy and the standard library.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.config.params import ExperimentSection, ParamsError, load_params
from pipeline.core.levels import AttentionShape, LevelError, heads_to_save
from pipeline.data.inputs import (
    DEFAULT_SHAPES,
    classification_source_problems,
    language_modeling_source_problems,
    model_problems,
    model_shape,
    translation_source_problems,
)
from pipeline.files.schema import CLASSIFICATION, DEFAULT, LANGUAGE_MODELING, SCRATCH

if TYPE_CHECKING:  # an annotation: no stage of another family depends on translation's params
    from pipeline.tasks.translation.params import TranslationParams

PREPARE = "prepare"  # the one stage that reads the user's model and data; the later stages read its outputs


def params_file(argv: list[str] | None = None, description: str = "Run one pipeline stage of the experiment in FILE."
                ) -> str:
    """The `--params FILE` of a stage's (or the checks') command line."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--params", default="params.yaml", metavar="FILE",
                        help="the experiment's params file (default: params.yaml)")
    return parser.parse_args(argv).params


def _fairseq_problems(params: TranslationParams) -> list[str]:
    m = params.model
    problems = []
    if not Path(m.checkpoint).is_file():
        problems.append(f"model.checkpoint: no file {m.checkpoint}; expected the .pt file written by fairseq-train")
    data_bin = Path(m.data_bin)
    if not data_bin.is_dir():
        problems.append(f"model.data_bin: no folder {m.data_bin}; expected the output folder of fairseq-preprocess "
                        f"(dict.<lang>.txt and the binarised splits)")
    elif not any(data_bin.glob("dict.*.txt")):
        problems.append(f"model.data_bin: {m.data_bin} has no dict.<lang>.txt; expected the output folder of "
                        f"fairseq-preprocess")
    return problems


def attention_shape(params: ExperimentSection) -> AttentionShape | None:
    """The attention of the model the params name, where it is known before the model loads: a scratch model's
    shape params, a pinned default's, a local folder's config.json or GGUF header (None for a hub id)."""
    m = params.model
    if m.name_or_path == SCRATCH and params.task == LANGUAGE_MODELING:
        return AttentionShape.alike(m.layers, m.heads, m.kv_heads)
    if m.name_or_path == SCRATCH:  # a Marian: each decoder layer has self- and cross-attention
        return AttentionShape.alike(m.encoder_layers + 2 * m.decoder_layers, m.heads)
    if m.name_or_path == DEFAULT:
        return DEFAULT_SHAPES.get(params.task)
    return model_shape(m.name_or_path)


def level_problems(params: ExperimentSection) -> list[str]:
    """The pruned models to save (prune.save_fractions, prune.kv_group_fractions) at levels the model's shape
    cannot take (pipeline/core/levels.py), when the shape is known here; the prune stage checks them all again."""
    shape, pp = attention_shape(params), params.prune
    if shape is None:
        return []
    problems = []
    wanted = [(f, pp.unit, pp.uniform, pp.min_heads_per_layer, "prune.save_fractions") for f in pp.save_fractions]
    wanted += [(f, "group", True, 0, "prune.kv_group_fractions") for f in pp.kv_group_fractions]  # the serving shape
    for fraction, unit, uniform, min_heads, key in wanted:
        try:
            heads_to_save(fraction, shape, unit, uniform, min_heads, key)
        except LevelError as error:
            problems.append(str(error))
    return problems


def input_problems(params: ExperimentSection) -> list[str]:
    """Every problem with the model and the data that the params name, one line each (none for the defaults)."""
    d, m = params.data, params.model
    if params.task == LANGUAGE_MODELING:
        model = model_problems(m.name_or_path)
        return [*model, *([] if model else level_problems(params)),
                *language_modeling_source_problems(d.source, d.text_column, d.fractions)]
    if params.task == CLASSIFICATION:
        text_columns = [c for c in (d.text_column, d.text_pair_column) if c is not None]
        model = model_problems(m.name_or_path)
        return [*model, *([] if model else level_problems(params)),
                *classification_source_problems(d.source, text_columns, d.label_column, d.fractions, params.seed)]
    if m.backend == "fairseq":
        return _fairseq_problems(params)
    problems = [] if m.name_or_path == SCRATCH else model_problems(m.name_or_path)
    problems += [] if problems else level_problems(params)
    if d.source != DEFAULT:
        problems += translation_source_problems(d.source, d.source_column, d.target_column, d.source_lang,
                                                d.target_lang, d.fractions)
    return problems


def check_all(path: str | Path, inputs: bool = True) -> list[str]:
    """Every problem with the params file `path` and (`inputs`) with the model and data it names, one line each."""
    try:
        params = load_params(path)
    except ParamsError as error:
        return [str(error)]
    return input_problems(params) if inputs else []


def preflight(stage: str, argv: list[str] | None = None) -> None:
    """A stage's checks before its heavy imports: its params, and for prepare the model and data they name. Exits
    with one `error:` line per problem."""
    problems = check_all(params_file(argv), inputs=stage == PREPARE)
    if problems:
        raise SystemExit("\n".join(f"error: {problem}" for problem in problems))
