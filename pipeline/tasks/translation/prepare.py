"""The prepare stage for translation: the default trains a subword vocabulary on the training pairs (for a Marian
model that the finetune stage trains from scratch); a pretrained model brings its own tokenizer; a fairseq
checkpoint brings its dictionaries and the binarised splits of its fairseq-preprocess folder."""

from __future__ import annotations

from pipeline.data.sources import MT_DATA_ATTRIBUTION, MT_DATA_NAME, materialize_model, tatoeba_file
from pipeline.data.subword import train_tokenizer
from pipeline.files.atomic import staged_dir
from pipeline.files.schema import (
    BLEU,
    DEFAULT,
    SCRATCH,
    TASK_DATA,
    TASK_DATA_ATTRIBUTION,
    TASK_METRIC,
    TASK_MODEL,
    TRANSLATION,
)
from pipeline.run.experiment import WHEEL_CACHE, Experiment, log
from pipeline.run.task import Prepared
from pipeline.tasks.translation.data import load_translation_task, tokenize_pairs
from pipeline.tasks.translation.marian import marian_config


def prepare(exp: Experiment) -> Prepared:
    if exp.task.is_fairseq:
        return fairseq(exp)
    p = exp.params
    d, m = p.data, p.model
    tatoeba = tatoeba_file(WHEEL_CACHE) if d.source == DEFAULT else None
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
    log.info("prepare: %s -> %s pairs", data_name, {s: len(ds) for s, ds in tokenized.items()})
    return Prepared(tokenized, {"task": TRANSLATION, TASK_METRIC: BLEU, TASK_MODEL: model_name, TASK_DATA: data_name,
                                TASK_DATA_ATTRIBUTION: MT_DATA_ATTRIBUTION if d.source == DEFAULT else None})


def fairseq(exp: Experiment) -> Prepared:
    """A fairseq checkpoint and its fairseq-preprocess folder: the model (with its dictionaries) is the base
    model, and the binarised splits become the data, token ids as they are."""
    from pipeline.tasks.translation import fairseq as fb

    m, d = exp.params.model, exp.params.data
    model = exp.task.source_model()
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
    log.info("prepare: %s -> %s pairs", data_name, {s: len(ds) for s, ds in splits.items()})
    return Prepared(splits, {"task": TRANSLATION, TASK_METRIC: BLEU, TASK_MODEL: fb.describe(model, m.checkpoint),
                             TASK_DATA: data_name, TASK_DATA_ATTRIBUTION: None, "target_lang": target_lang,
                             "pad_token_id": model.config.pad_token_id})
