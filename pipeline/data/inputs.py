"""The user's inputs, checked before anything heavy loads: the model that `model.name_or_path` names, the hub when
a name needs it, and a task's local files (columns, empty cells, labels, split sizes and classes).

The prepare stage and `python -m pipeline.checks` run these checks first, in about a second (no torch, no
transformers, no pandas), and the loaders in classification.py and translation.py read and encode the data through
the same functions, so what was checked is what is loaded. Problems are `InputError`s: one line each, naming the
param, the file and what would be right.
"""

from __future__ import annotations

import difflib
import json
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

from pipeline.core.gguf import SUFFIX, GGUFError, local_gguf, read_metadata
from pipeline.core.levels import AttentionShape
from pipeline.core.sites import FAMILIES
from pipeline.data.catalog import GLUE_TASKS, HUB_CORPORA, LM_CORPORA, OFFLINE_TASKS, HubCorpus
from pipeline.data.local_files import (
    FORMATS,
    InputError,
    Table,
    check_filled,
    check_fractions,
    is_blank,
    looks_like_path,
    missing_path,
    parallel_text_files,
    read_lines,
    read_table,
    split_files,
    stratified_plan,
)
from pipeline.files.schema import CLASSIFICATION, DEFAULT, LANGUAGE_MODELING, SCRATCH, SPLITS, TATOEBA

MODEL_CONFIG = "config.json"
# What AutoTokenizer reads: a fast tokenizer's file, a slow one's vocabulary, or a sentencepiece model.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json")
TOKENIZER_PATTERNS = ("*.model", "*.spm")
WEIGHT_FILES = (
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
# pandas' default missing-value markers: a label spelled so is a hole in the data, not a class.
MISSING_LABELS = {"nan", "na", "n/a", "null", "none", "<na>", "-nan"}
HUB = "https://huggingface.co"
# The attention of the pinned default models (pipeline/data/assets.py), as their config.json and GGUF header state
# it (tests/test_gguf.py checks SmolLM2's): the levels a uniform plan can save are known before anything is fetched.
DEFAULT_SHAPES = {CLASSIFICATION: AttentionShape.alike(sites=6, heads=12),
                  LANGUAGE_MODELING: AttentionShape.alike(sites=30, heads=9, kv_heads=3)}


# --- the hub ----------------------------------------------------------------------------------------------------------


def hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the Hugging Face hub cannot be reached from here (HF_HUB_OFFLINE, or the endpoint's host refusing a TCP
    connection within `timeout` seconds), or None when it can."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", HUB))
    host, port = endpoint.hostname or "", endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as error:
        return f"{host}:{port}: {error.strerror or error}"
    return None


def _offline_advice(what: str) -> str:
    return f"{what}; point it at local files instead (the README's 'When something is wrong'), or use default"


# --- the model --------------------------------------------------------------------------------------------------------


def quantization_problem(config: dict, where: str, key: str) -> str | None:
    """Why a checkpoint whose config has a quantization_config cannot be used, in one line; None when it has none.
    Heads are pruned and the result saved with save_pretrained, which transformers refuses for a quantized model
    (GGUF's "not serializable"), and the quantized layers are no nn.Linear that head surgery could cut."""
    quantization = config.get("quantization_config")
    if quantization is None:
        return None
    method = quantization.get("quant_method", "not named") if isinstance(quantization, dict) else "not named"
    return (f"{key}: {where} is a quantized checkpoint ({MODEL_CONFIG} has quantization_config, quant_method "
            f"{method}), which can be neither pruned nor saved; a GGUF file or folder is converted by prepare: name "
            f"the .gguf file instead; a bitsandbytes, GPTQ, AWQ or other quantized checkpoint: use the unquantised "
            f"model")


def _safetensors_problem(path: Path) -> str | None:
    """Why `path` is no readable safetensors file (its 8-byte header length and JSON header), or None: the header
    alone, so a truncated or overwritten weights file is named here, not in a later stage's traceback."""
    try:
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = f.read(size) if size <= path.stat().st_size - 8 else b""
        if len(header) != size or not header:
            return "its header is cut short"
        json.loads(header)
    except OSError as error:
        return str(error.strerror or error)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return "its header is not JSON"
    return None


def model_folder_problems(folder: Path, key: str) -> list[str]:
    """What keeps `folder` from being a model this pipeline can prune: its config, its family, its weights."""
    config_file = folder / MODEL_CONFIG
    if not config_file.is_file():
        found = sorted(p.name for p in folder.iterdir())[:8]
        return [f"{key}: {folder} is not a model folder: it has no {MODEL_CONFIG} (found: "
                f"{', '.join(found) or 'nothing'}); expected a Hugging Face model folder (save_pretrained's) or a "
                f"folder holding one {SUFFIX} file"]
    try:
        config = json.loads(config_file.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return [f"{key}: {config_file} is not valid JSON ({error})"]
    if not isinstance(config, dict):
        return [f"{key}: {config_file} is not a JSON object"]
    model_type = config.get("model_type")
    problems = [line for line in [quantization_problem(config, str(folder), key)] if line]
    if model_type not in FAMILIES:
        problems.append(f"{key}: {folder} is a {model_type or 'model with no model_type'} model, which the "
                        f"head-surgery core does not support; supported families (config.json model_type): "
                        f"{', '.join(sorted(FAMILIES))}")
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        problems.append(f"{key}: {folder} has a {MODEL_CONFIG} but no weights (expected one of "
                        f"{', '.join(WEIGHT_FILES)})")
    elif (folder / WEIGHT_FILES[0]).is_file():
        why = _safetensors_problem(folder / WEIGHT_FILES[0])
        if why is not None:
            problems.append(f"{key}: {folder / WEIGHT_FILES[0]} is not a readable safetensors file ({why}); save "
                            f"the model again with save_pretrained")
    if not (any((folder / name).is_file() for name in TOKENIZER_FILES)
            or any(next(folder.glob(pattern), None) for pattern in TOKENIZER_PATTERNS)):
        problems.append(f"{key}: {folder} has no tokenizer (expected {', '.join(TOKENIZER_FILES)} or a "
                        f"sentencepiece model): save it beside the model with tokenizer.save_pretrained")
    return problems


def gguf_problems(path: Path, key: str) -> list[str]:
    """What keeps the GGUF file `path` from becoming a model this pipeline can prune, from its header alone: prepare
    converts it (pipeline/core/gguf.py), so it needs an architecture the head-surgery core supports and a
    tokenizer."""
    try:
        header = read_metadata(path, ["general.architecture", "tokenizer.ggml.model"])
    except GGUFError as error:
        return [f"{key}: {error}"]
    architecture = header.get("general.architecture")
    problems = []
    if architecture not in FAMILIES:  # llama.cpp names these architectures as transformers' model_type does
        problems.append(f"{key}: {path} is a GGUF file of architecture {architecture or 'not named'}, which the "
                        f"head-surgery core does not support; supported families: {', '.join(sorted(FAMILIES))}")
    if "tokenizer.ggml.model" not in header:
        problems.append(f"{key}: {path} holds no tokenizer (no tokenizer.ggml.* metadata), which prepare needs to "
                        f"convert it into a model folder")
    return problems


def model_problems(name_or_path: str, key: str = "model.name_or_path") -> list[str]:
    """Problems with the model that `name_or_path` names: the offline default, a local folder or GGUF file, or a
    hub id."""
    if name_or_path in (DEFAULT, SCRATCH):
        return []
    path = Path(name_or_path).expanduser()
    gguf_file = local_gguf(path)
    if gguf_file is not None:
        return gguf_problems(gguf_file, key)
    if path.is_dir():
        return model_folder_problems(path, key)
    if path.exists():
        return [f"{key}: {path} is a file; expected a model folder (with {MODEL_CONFIG} and weights), a {SUFFIX} "
                f"file, a hub id, or default"]
    if looks_like_path(name_or_path):
        return [f"{key}: {missing_path(name_or_path)}; expected a model folder, a hub id, or default"]
    reason = hub_unreachable()
    if reason is not None:
        return [_offline_advice(f"{key}: {name_or_path!r} is no local folder, so it names a Hugging Face hub model, "
                                f"but the hub is unreachable from here ({reason})")]
    return _hub_model_problems(name_or_path, key)


def model_shape(name_or_path: str) -> AttentionShape | None:
    """The attention of a local model, from its config.json or GGUF header (a decoder- or encoder-only stack: one
    site a layer); None where that is unknown before the model loads (a hub id, an encoder-decoder, other keys)."""
    path = Path(name_or_path).expanduser()
    gguf_file = local_gguf(path)
    try:
        if gguf_file is not None:
            architecture = read_metadata(gguf_file, ["general.architecture"]).get("general.architecture")
            keys = [f"{architecture}.{name}" for name in ("block_count", "attention.head_count",
                                                          "attention.head_count_kv")]
            values = read_metadata(gguf_file, keys)
            layers, heads, kv_heads = (values.get(k) for k in keys)
        elif (path / MODEL_CONFIG).is_file():
            config = json.loads((path / MODEL_CONFIG).read_text("utf-8"))
            if config.get("is_encoder_decoder"):
                return None
            layers, heads = config.get("num_hidden_layers"), config.get("num_attention_heads")
            kv_heads = config.get("num_key_value_heads")
        else:
            return None
    except (GGUFError, OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return None  # model_problems names what is wrong with the file
    if not (isinstance(layers, int) and isinstance(heads, int) and isinstance(kv_heads, int | None)):
        return None  # e.g. a GGUF that states heads layer by layer
    return AttentionShape.alike(layers, heads, kv_heads)


def _hub_model_problems(repo_id: str, key: str) -> list[str]:
    """The family of a hub model, from its config.json alone (a few KB), before prepare downloads the weights."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError

    try:
        config_file = Path(hf_hub_download(repo_id, MODEL_CONFIG))
    except HFValidationError as error:
        return [f"{key}: {repo_id!r} is neither a local folder nor a valid hub id ({error})"]
    except (HfHubHTTPError, OSError) as error:
        return [f"{key}: cannot fetch {repo_id}'s {MODEL_CONFIG} from the hub ({type(error).__name__}: "
                f"{str(error).splitlines()[0]})"]
    config = json.loads(config_file.read_text("utf-8"))
    problems = [line for line in [quantization_problem(config, repo_id, key)] if line]
    if config.get("model_type") not in FAMILIES:
        problems.append(f"{key}: {repo_id} is a {config.get('model_type')} model, which the head-surgery core does "
                        f"not support; supported families: {', '.join(sorted(FAMILIES))}")
    return problems


# --- classification data ----------------------------------------------------------------------------------------------


def _read_source(path: Path) -> Table:
    try:
        return read_table(path)
    except InputError as error:
        raise InputError(f"data.source: {error}") from None


@dataclass(frozen=True)
class LocalClassification:
    """A local classification task as read and checked: the tables of the given splits, their class ids, and where
    each of SPLITS comes from (stratified_plan)."""

    tables: dict[str, Table]
    ids: dict[str, np.ndarray]
    num_labels: int
    label_names: tuple[str, ...] | None
    plan: dict[str, tuple[str, np.ndarray]]


def _class_id(value: object) -> int | None:
    """A class id as written: an integer (1, "1", 1.0, "1.0"), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    text = str(value).strip()
    head, _, tail = text.partition(".")
    if head.lstrip("+-").isdigit() and (not tail or set(tail) == {"0"}):
        return int(head)
    return None


def _is_fractional(value: object) -> bool:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return False
    return not isinstance(value, bool) and np.isfinite(number) and not number.is_integer()


def encode_labels(tables: Mapping[str, Table], label_column: str, key: str = "data.label_column"
                  ) -> tuple[dict[str, np.ndarray], int, tuple[str, ...] | None]:
    """Class ids of each split's label column: ids as written (0..K-1, every one of them in train), or label names,
    mapped to their index among train's sorted names (the names are kept). Refuses holes, a mix of ids and names,
    negative or missing ids, and dev/test classes that train lacks."""
    for table in tables.values():
        column = table.columns[label_column]
        blank = [i for i, v in enumerate(column) if is_blank(v) or str(v).strip().lower() in MISSING_LABELS]
        if blank:
            raise InputError(f"{key}: {table.path}: {len(blank)} row(s) without a label in column {label_column!r} "
                             f"({table.where(blank)})")
    for table in tables.values():
        fractional = [i for i, v in enumerate(table.columns[label_column]) if _is_fractional(v)]
        if fractional:
            raise InputError(f"{key}: {table.path}: labels must be class ids (integers >= 0) or names; "
                             f"{table.columns[label_column][fractional[0]]!r} ({table.where(fractional)}) is a "
                             f"fractional number (a regression target? this pipeline classifies)")
    parsed = {split: [_class_id(v) for v in t.columns[label_column]] for split, t in tables.items()}
    counts = {split: sum(i is not None for i in ids) for split, ids in parsed.items()}
    if all(counts[s] == len(tables[s]) for s in tables):
        ids = {split: np.asarray(v, dtype=np.int64) for split, v in parsed.items()}
        for split, v in ids.items():
            negative = np.flatnonzero(v < 0)
            if len(negative):
                raise InputError(f"{key}: {tables[split].path}: class ids must be integers >= 0; {len(negative)} "
                                 f"row(s) have {sorted(set(v[negative].tolist()))[:3]} ({tables[split].where(negative)}"
                                 f"), e.g. GLUE's -1 for a hidden test label")
        seen = set(ids["train"].tolist())
        for split, v in ids.items():
            unseen = sorted(set(v.tolist()) - seen)
            if unseen:
                raise InputError(f"{key}: {tables[split].path}: class id(s) {unseen[:5]} never occur in train "
                                 f"(train has {sorted(seen)}); a model cannot learn a class it never sees")
        num_labels = max(seen) + 1
        if len(seen) > 1 and seen != set(range(num_labels)):  # one class: check_split_classes says so
            absent = sorted(set(range(num_labels)) - seen)
            raise InputError(f"{key}: class ids must run 0..K-1, each occurring in train; {tables['train'].path} "
                             f"has {sorted(seen)} (no {absent[:5]}): renumber them, or write the labels as names")
        return ids, num_labels, None
    if any(counts.values()):  # some labels are class ids, others are not
        mixed = [s for s in tables if 0 < counts[s] < len(tables[s])]
        if not mixed:
            with_ids = next(s for s in tables if counts[s])
            with_names = next(s for s in tables if not counts[s])
            raise InputError(f"{key}: the labels of {tables[with_ids].path} are class ids and those of "
                             f"{tables[with_names].path} names; use one or the other")
        table, parsed_labels = tables[mixed[0]], parsed[mixed[0]]
        names = [i for i, v in enumerate(parsed_labels) if v is None]
        numbers = [i for i, v in enumerate(parsed_labels) if v is not None]
        raise InputError(f"{key}: {table.path}: the labels in {label_column!r} mix class ids "
                         f"({table.where(numbers, 2)}) and names ({table.where(names, 2)}); use one or the other")
    strings = {split: [str(v).strip() for v in t.columns[label_column]] for split, t in tables.items()}
    names = sorted(set(strings["train"]))
    index = {name: i for i, name in enumerate(names)}
    for split, values in strings.items():
        unknown = sorted(set(values) - set(index))
        if unknown:
            raise InputError(f"{key}: {tables[split].path}: labels {unknown[:5]} not seen in train; train labels: "
                             f"{names}")
    ids = {split: np.asarray([index[v] for v in values], dtype=np.int64) for split, values in strings.items()}
    return ids, len(names), tuple(names)


def check_split_classes(plan: Mapping[str, tuple[str, np.ndarray]], ids: Mapping[str, np.ndarray],
                        fractions: tuple[float, ...], key: str = "data") -> None:
    """Each split must hold two examples of two classes at least: a split of one class can be neither learnt from
    nor scored (accuracy is trivial there, Matthews and F1 undefined)."""
    for split, (given, rows) in plan.items():
        classes = np.unique(ids[given][rows])
        if len(classes) < 2:
            carved = "" if given == split else (f" (carved out of {len(ids[given])} training rows by data.fractions "
                                                f"{list(fractions)})")
            raise InputError(f"{key}: {split} would hold {len(rows)} example(s) of {len(classes)} class(es){carved}; "
                             f"every split needs examples of at least two classes: give more examples, or larger "
                             f"fractions for dev and test")


def read_classification(source: str, files: Mapping[str, str | Path] | None, text_columns: list[str],
                        label_column: str, fractions: tuple[float, ...], seed: int) -> LocalClassification:
    """Read and check a local classification source (a file, a folder of split files, or `files`)."""
    paths = split_files(source, files)
    if paths is None:
        close = [] if looks_like_path(source) else difflib.get_close_matches(source, list(OFFLINE_TASKS), n=1)
        why = f"no offline task or file {source} (did you mean {close[0]}?)" if close else missing_path(source)
        raise InputError(f"data.source: {why}; expected {', '.join(OFFLINE_TASKS)}, glue/<task> or a local "
                         f"CSV/TSV/JSON/JSONL file or folder")
    tables = {split: _read_source(path) for split, path in paths.items()}
    for table in tables.values():
        if not len(table):
            raise InputError(f"data.source: {table.path}: no rows under its header")
        table.require([*text_columns, label_column], "data")
        check_filled(table, text_columns, "text", "data")
    ids, num_labels, label_names = encode_labels(tables, label_column)
    if len(np.unique(ids["train"])) < 2:
        files = ", ".join(str(t.path) for t in tables.values())
        raise InputError(f"data.label_column: every label in {files} is {tables['train'].columns[label_column][0]!r}: "
                         f"a task of one class can be neither learnt nor scored; give examples of two classes at least")
    plan = stratified_plan(ids, tuple(check_fractions(fractions)), seed)
    check_split_classes(plan, ids, fractions)
    return LocalClassification(tables, ids, num_labels, label_names, plan)


def classification_source_problems(source: str, text_columns: list[str], label_column: str,
                                   fractions: tuple[float, ...], seed: int) -> list[str]:
    """Problems with `data.source` of a classification experiment (the offline tasks, the default among them, have
    none: their files are pinned)."""
    if source in OFFLINE_TASKS:
        return []
    if source.startswith("glue/"):
        task = source.removeprefix("glue/")
        if task not in GLUE_TASKS:
            return [f"data.source: unknown GLUE task {task!r}; allowed: {', '.join(sorted(GLUE_TASKS))}"]
        reason = hub_unreachable()
        return [] if reason is None else [_offline_advice(
            f"data.source: {source} is read from the Hugging Face hub (nyu-mll/glue), which is unreachable from "
            f"here ({reason}); save its splits as local train/dev/test CSV or JSONL files and point data.source at "
            f"their folder")]
    try:
        read_classification(source, None, text_columns, label_column, fractions, seed)
    except InputError as error:
        return [str(error)]
    return []


# --- translation data -------------------------------------------------------------------------------------------------


def read_pairs(path: Path, source_column: str, target_column: str, source_lang: str | None,
               target_lang: str | None) -> tuple[list[str], list[str]]:
    """One local file's sentence pairs (sources, targets): named columns, else the hub's "translation" objects.
    Every row must hold both sentences (a TSV line with a missing or extra tab is named by read_table)."""
    table = _read_source(path)
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
        return _hub_corpus_problems(source, HUB_CORPORA, "language pair", "pairs as local train/dev/test TSV or "
                                    "JSONL files with source and target columns")
    try:
        pairs = local_pairs(source, source_column, target_column, source_lang, target_lang)
        # split_by_source cuts whole groups, so the training size is the size it aims at
        _check_carved_splits(len(pairs["train"][0]), set(pairs), fractions, "pairs", "training pairs")
    except InputError as error:
        return [str(error)]
    return []


def _hub_corpus_problems(source: str, corpora: dict[str, HubCorpus], config_kind: str, save_as: str) -> list[str]:
    """A `<corpus>/<config>` source on the hub: an unknown config, or the hub unreachable (with what to save)."""
    corpus, _, config = source.partition("/")
    if config not in corpora[corpus].pairs:
        return [f"data.source: unknown {corpus} {config_kind} {config!r}; allowed: {', '.join(corpora[corpus].pairs)}"]
    reason = hub_unreachable()
    return [] if reason is None else [_offline_advice(
        f"data.source: {source} is read from the Hugging Face hub ({corpora[corpus].repo}), which is unreachable "
        f"from here ({reason}); save its {save_as} and point data.source at their folder")]


def _check_carved_splits(train_size: int, given: set[str], fractions: tuple[float, ...], items: str,
                         out_of: str) -> None:
    """Each split carved out of train (no file of its own) gets at least one item by `data.fractions`."""
    f = check_fractions(fractions)
    carved = [s for s in SPLITS if s not in given]
    for split in carved:
        if train_size * f[SPLITS.index(split)] / (f[0] + sum(f[SPLITS.index(s)] for s in carved)) < 1:
            raise InputError(f"data: {split} would get no {items} out of {train_size} {out_of} by "
                             f"data.fractions {list(fractions)}; give more {items}, or a {split} file")


# --- language-modelling data ------------------------------------------------------------------------------------------

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
        table = _read_source(path)
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
        return _hub_corpus_problems(source, LM_CORPORA, "config", "texts as local train/dev/test .txt files (one "
                                    "text a line)")
    try:
        texts = local_texts(source, text_column)
        _check_carved_splits(len(set(texts["train"])), set(texts), fractions, "texts", "distinct training texts")
    except InputError as error:
        return [str(error)]
    return []
