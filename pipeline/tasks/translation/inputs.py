"""What a translation experiment takes, checked before torch loads: a Hugging Face encoder-decoder (`ACCEPTS`) or
a fairseq checkpoint with its fairseq-preprocess folder, and its sentence pairs (parallel text files, or CSV/TSV/JSON
files), read by the same functions the prepare stage loads them with (pipeline/tasks/translation/data.py). Light on
purpose: the standard library.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core.levels import AttentionShape
from pipeline.data.catalog import HUB_CORPORA
from pipeline.data.inputs import (
    Accepts,
    check_carved_splits,
    hub_corpus_problems,
    level_problems,
    model_problems,
    model_shape,
    read_source,
)
from pipeline.data.local_files import (
    InputError,
    check_filled,
    is_blank,
    missing_path,
    parallel_text_files,
    read_lines,
    split_files,
)
from pipeline.files.schema import DEFAULT, SCRATCH, TRANSLATION

if TYPE_CHECKING:
    from pipeline.tasks.translation.params import TranslationParams

# The encoder-decoders of pipeline/core/sites.py that Hugging Face loads as a generating seq2seq model (backend hf):
# an encoder or a decoder-only model loads as its own architecture and fails when it is asked to translate.
ACCEPTS = Accepts(TRANSLATION, model_families=("bart", "marian"))


def read_pairs(path: Path, source_column: str, target_column: str, source_lang: str | None,
               target_lang: str | None) -> tuple[list[str], list[str]]:
    """One local file's sentence pairs (sources, targets): named columns, else the hub's "translation" objects.
    Every row must hold both sentences (a TSV line with a missing or extra tab is named by read_table)."""
    table = read_source(path)
    columns = table.columns
    if source_column in columns and target_column in columns:
        pairs = columns[source_column], columns[target_column]
        check_filled(table, [source_column, target_column], "sentence", "data")
    elif "translation" in columns:
        if source_lang is None or target_lang is None:
            raise InputError(f"data: {path}: a 'translation' column needs data.source_lang and data.target_lang to "
                             f"pick languages")
        rows = columns["translation"]
        bad = [i for i, t in enumerate(rows) if not isinstance(t, dict)]
        if bad:
            raise InputError(f"data: {path}: 'translation' must hold {{language: sentence}} objects; "
                             f"{table.where(bad)} do not")
        lacking = [i for i, t in enumerate(rows) if any(is_blank(t.get(lang)) for lang in (source_lang, target_lang))]
        if lacking:
            raise InputError(f"data: {path}: {len(lacking)} 'translation' object(s) lack a {source_lang} or "
                             f"{target_lang} sentence ({table.where(lacking)})")
        pairs = [t[source_lang] for t in rows], [t[target_lang] for t in rows]
    else:
        raise InputError(f"data: {path}: expected columns {source_column!r} and {target_column!r} (data.source_column, "
                         f"data.target_column), or a 'translation' column of {{language: sentence}} objects; "
                         f"available columns: {list(columns)}")
    if not len(table):
        raise InputError(f"data.source: {path}: no sentence pairs under its header")
    return [str(s) for s in pairs[0]], [str(t) for t in pairs[1]]


def read_parallel(source_file: Path, target_file: Path) -> tuple[list[str], list[str]]:
    """A split's sentence pairs from two plain-text files with one sentence per line, line i of each a pair."""
    for path in (source_file, target_file):
        if not path.is_file():
            other = source_file if path == target_file else target_file
            raise InputError(f"data.source: {path} does not exist, but {other} does; a parallel corpus needs both "
                             f"sides")
    try:
        sources, targets = read_lines(source_file), read_lines(target_file)
    except InputError as error:
        raise InputError(f"data.source: {error}") from None
    if len(sources) != len(targets):
        raise InputError(f"data.source: {source_file} has {len(sources)} lines and {target_file} {len(targets)}; "
                         f"parallel files hold one sentence per line, line i of each a translation pair")
    blank = [i + 1 for i, pair in enumerate(zip(sources, targets, strict=True)) if any(map(is_blank, pair))]
    if blank:
        shown = ", ".join(map(str, blank[:5])) + (f" and {len(blank) - 5} more" if len(blank) > 5 else "")
        raise InputError(f"data.source: {source_file} / {target_file}: {len(blank)} line(s) with an empty sentence "
                         f"(lines {shown})")
    if not sources:
        raise InputError(f"data.source: {source_file} is empty")
    return sources, targets


def local_pairs(source: str, source_column: str, target_column: str, source_lang: str | None,
                target_lang: str | None) -> dict[str, tuple[list[str], list[str]]]:
    """The sentence pairs of each split of a local source: a folder of parallel text files, or CSV/TSV/JSON files."""
    parallel = parallel_text_files(source, source_lang, target_lang)
    if parallel is not None:
        return {split: read_parallel(*files) for split, files in parallel.items()}
    paths = split_files(source, None)
    if paths is None:
        raise InputError(f"data.source: {missing_path(source)}; expected default, "
                         f"{', '.join(f'{c}/<pair>' for c in HUB_CORPORA)}, a folder of parallel text files "
                         f"(train.<source_lang>, train.<target_lang>, ...), or a CSV/TSV/JSON/JSONL file or folder")
    return {split: read_pairs(path, source_column, target_column, source_lang, target_lang)
            for split, path in paths.items()}


def translation_source_problems(source: str, source_column: str, target_column: str, source_lang: str | None,
                                target_lang: str | None, fractions: tuple[float, ...]) -> list[str]:
    """Problems with `data.source` of a translation experiment (the offline default has none)."""
    if source == DEFAULT:
        return []
    if source.partition("/")[0] in HUB_CORPORA:
        return hub_corpus_problems(source, HUB_CORPORA, "language pair", "pairs as local train/dev/test TSV or "
                                    "JSONL files with source and target columns")
    try:
        pairs = local_pairs(source, source_column, target_column, source_lang, target_lang)
        # split_by_source cuts whole groups, so the training size is the size it aims at
        check_carved_splits(len(pairs["train"][0]), set(pairs), fractions, "pairs", "training pairs")
    except InputError as error:
        return [str(error)]
    return []


def fairseq_problems(params: TranslationParams) -> list[str]:
    """A fairseq checkpoint and its fairseq-preprocess folder (`model.backend: fairseq`), as far as they can be seen
    without fairseq."""
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


def attention_shape(params: TranslationParams) -> AttentionShape | None:
    """The attention of the model, where it is known before it loads: a scratch Marian's shape params (each decoder
    layer has self- and cross-attention), a local folder's config.json (None for an encoder-decoder's, or a hub id)."""
    m = params.model
    if m.name_or_path == SCRATCH:
        return AttentionShape.alike(m.encoder_layers + 2 * m.decoder_layers, m.heads)
    return None if m.name_or_path == DEFAULT else model_shape(m.name_or_path)


def problems(params: TranslationParams) -> list[str]:
    """Every problem with the model and the data that a translation experiment's params name, one line each."""
    d, m = params.data, params.model
    # Sharding (accelerate's device_map) is wired into the language-modelling family only: refuse it, not ignore it.
    sharded = ["runtime.placement: sharded is for language models (task: language-modeling); a translation model "
               "runs whole on runtime.device: use placement: whole"] if params.runtime.placement == "sharded" else []
    if m.backend == "fairseq":
        return sharded + fairseq_problems(params)
    found = sharded + model_problems(m.name_or_path, ACCEPTS)
    found += [] if found else level_problems(params.prune, attention_shape(params))
    if d.source != DEFAULT:
        found += translation_source_problems(d.source, d.source_column, d.target_column, d.source_lang,
                                             d.target_lang, d.fractions)
    return found
