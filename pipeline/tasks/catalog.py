"""The datasets this project knows by name on the Hugging Face hub: GLUE's tasks, the translation and the
language-modelling corpora.

Pure data (no datasets, no torch), so that params checks can name what is allowed before anything heavy loads.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GlueTask:
    text_column: str
    text_pair_column: str | None
    metric: str
    label_names: tuple[str, ...]


# Label names follow the nyu-mll/glue dataset card; they are used only if the loaded data lacks them.
GLUE_TASKS = {
    "cola": GlueTask("sentence", None, "matthews", ("unacceptable", "acceptable")),
    "sst2": GlueTask("sentence", None, "accuracy", ("negative", "positive")),
    "mrpc": GlueTask("sentence1", "sentence2", "f1", ("not_equivalent", "equivalent")),
    "qqp": GlueTask("question1", "question2", "f1", ("not_duplicate", "duplicate")),
    "mnli": GlueTask("premise", "hypothesis", "accuracy", ("entailment", "neutral", "contradiction")),
    "qnli": GlueTask("question", "sentence", "accuracy", ("entailment", "not_entailment")),
    "rte": GlueTask("sentence1", "sentence2", "accuracy", ("entailment", "not_entailment")),
}

# Which GLUE split becomes which of ours ("dev" is always carved out of train).
GLUE_EVAL_SPLITS = {"mnli": {"test": "validation_matched", "test_mismatched": "validation_mismatched"}}



@dataclass(frozen=True)
class HubCorpus:
    repo: str
    config_prefix: str  # hub config name = prefix + pair
    pairs: tuple[str, ...]  # translation: language pairs; language modelling: configs
    splits: tuple[tuple[str, str], ...] = (("train", "train"), ("dev", "validation"), ("test", "test"))


HUB_CORPORA = {
    "wmt14": HubCorpus("wmt/wmt14", "", ("cs-en", "de-en", "fr-en", "hi-en", "ru-en")),
    "iwslt2017": HubCorpus(
        "IWSLT/iwslt2017",
        "iwslt2017-",
        tuple(
            f"{a}-{b}"
            for x in ("ar", "de", "fr", "it", "ja", "ko", "nl", "ro", "zh")
            for a, b in (("en", x), (x, "en"))
        ),
    ),
}



# Language-modelling corpora on the hub: the name's part after "/" is the config. Salesforce/wikitext has train,
# validation and test splits of one paragraph (or "= heading =") a row, with empty rows between paragraphs.
LM_CORPORA = {
    "wikitext": HubCorpus("Salesforce/wikitext", "", ("wikitext-2-raw-v1", "wikitext-103-raw-v1", "wikitext-2-v1",
                                                      "wikitext-103-v1")),
}
