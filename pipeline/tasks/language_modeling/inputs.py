"""What a language-modelling experiment takes, checked before torch loads: a decoder-only model (`ACCEPTS`: a
folder, a GGUF file, a hub id, or a Llama trained from scratch) and its texts (.txt files, one text a line, or a text
column of CSV/TSV/JSON files), read by the same functions the prepare stage loads them with
(pipeline/tasks/language_modeling/data.py). Light on purpose: the standard library.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core.levels import AttentionShape
from pipeline.data.catalog import LM_CORPORA
from pipeline.data.inputs import (
    Accepts,
    check_carved_splits,
    hub_corpus_problems,
    level_problems,
    model_problems,
    model_shape,
    read_source,
)
from pipeline.data.local_files import FORMATS, InputError, check_filled, is_blank, missing_path, read_lines, split_files
from pipeline.files.schema import DEFAULT, LANGUAGE_MODELING, PLACEMENTS, SCRATCH, TATOEBA

if TYPE_CHECKING:
    from pipeline.tasks.language_modeling.params import LanguageModelingParams

# The decoder-only families of pipeline/core/sites.py, which load as causal LMs whose every attention is the
# decoder's self-attention (the token estimator and perplexity assume it); an encoder or encoder-decoder is refused.
# Every placement: its models are decoder-only, which pipeline/core/layerwise.py scores one layer at a time.
ACCEPTS = Accepts(LANGUAGE_MODELING,
                  model_families=("gemma3_text", "gpt2", "llama", "mistral", "opt", "qwen2", "qwen3"),
                  placements=PLACEMENTS)
# The attention of the pinned default (SmolLM2-135M), as its GGUF header states it (tests/test_gguf.py checks it).
DEFAULT_SHAPE = AttentionShape.alike(sites=30, heads=9, kv_heads=3)
TEXT_FORMATS = (".txt", *FORMATS)  # a .txt file holds one text (a sentence or a document) a line


def read_texts(path: Path, text_column: str) -> list[str]:
    """One local file's texts: the non-blank lines of a .txt file (blank lines, as between wikitext's paragraphs,
    hold no text), or the `text_column` of a CSV/TSV/JSON file, where an empty cell is refused."""
    if path.suffix.lower() == ".txt":
        try:
            texts = [line for line in read_lines(path) if not is_blank(line)]
        except InputError as error:
            raise InputError(f"data.source: {error}") from None
    else:
        table = read_source(path)
        table.require([text_column], "data.text_column")
        check_filled(table, [text_column], "text", "data")
        texts = [str(t) for t in table.columns[text_column]]
    if not texts:
        raise InputError(f"data.source: {path} holds no text")
    return texts


def local_texts(source: str, text_column: str) -> dict[str, list[str]]:
    """The texts of each split of a local source: a file (train), or a folder of train/dev/test files."""
    paths = split_files(source, None, TEXT_FORMATS)
    if paths is None:
        raise InputError(f"data.source: {missing_path(source)}; expected default, "
                         f"{', '.join(f'{c}/<config>' for c in LM_CORPORA)}, a .txt file (one text a line), a "
                         f"CSV/TSV/JSON/JSONL file with a text column, or a folder of train/dev/test files")
    return {split: read_texts(path, text_column) for split, path in paths.items()}


def language_modeling_source_problems(source: str, text_column: str, fractions: tuple[float, ...]) -> list[str]:
    """Problems with `data.source` of a language-modelling experiment (the offline corpora have none)."""
    if source in (DEFAULT, TATOEBA):
        return []
    if source.partition("/")[0] in LM_CORPORA:
        return hub_corpus_problems(source, LM_CORPORA, "config", "texts as local train/dev/test .txt files (one "
                                    "text a line)")
    try:
        texts = local_texts(source, text_column)
        check_carved_splits(len(set(texts["train"])), set(texts), fractions, "texts", "distinct training texts")
    except InputError as error:
        return [str(error)]
    return []


def attention_shape(params: LanguageModelingParams) -> AttentionShape | None:
    """The attention of the model, where it is known before it loads: a scratch Llama's shape params, the pinned
    default's, a local folder's config.json or GGUF header (None for a hub id)."""
    m = params.model
    if m.name_or_path == SCRATCH:
        return AttentionShape.alike(m.layers, m.heads, m.kv_heads)
    return DEFAULT_SHAPE if m.name_or_path == DEFAULT else model_shape(m.name_or_path)


def problems(params: LanguageModelingParams) -> list[str]:
    """Every problem with the model and the data that a language-modelling experiment's params name, one line each."""
    d = params.data
    model = model_problems(params.model.name_or_path, ACCEPTS)
    return [*model, *([] if model else level_problems(params.prune, attention_shape(params))),
            *language_modeling_source_problems(d.source, d.text_column, d.fractions)]
