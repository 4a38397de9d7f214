"""Bad input gets one line, fast, before anything is written: what is wrong, where, and what would be right.

Most claims are checked in-process through `check_all` (what `python -m pipeline.checks` and the prepare stage run);
a few run the real commands, to show what a user sees: one `error:` line, no traceback, no output folder, and no
torch imported before the line appears.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file

from pipeline.checks.tiny_project import tool_env, write_tiny_assets
from pipeline.run.preflight import check_all
from tests.tiny_project import ROOT, tiny_mt_params, tiny_params

CLOSED_PORT = "http://127.0.0.1:9"  # the discard port: nothing listens, so the "hub" refuses at once
SAFETENSORS_WITH_NO_TENSORS = (2).to_bytes(8, "little") + b"{}"  # a readable header, nothing else


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("assets")
    write_tiny_assets(root)
    return root


@pytest.fixture()
def project(tmp_path, assets, monkeypatch) -> Path:
    """A folder holding the tiny model and data.csv, as the cwd, with the hub unreachable."""
    (tmp_path / "tiny_model").symlink_to(assets / "tiny_model")
    (tmp_path / "data.csv").write_bytes((assets / "data.csv").read_bytes())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_ENDPOINT", CLOSED_PORT)
    return tmp_path


def problems(**changes) -> list[str]:
    """check_all on the tiny params with sections updated: problems(data={"source": "x.csv"})."""
    params = tiny_params()
    for section, values in changes.items():
        if isinstance(values, dict):
            params[section].update(values)
        else:
            params[section] = values
    Path("params.yaml").write_text(yaml.safe_dump(params))
    return check_all("params.yaml")


def only(found: list[str]) -> str:
    assert len(found) == 1, found
    return found[0]


def write_csv(name: str, rows: list[tuple], header: str = "text,label") -> str:
    Path(name).write_text("\n".join([header, *(",".join(map(str, r)) for r in rows)]) + "\n", encoding="utf-8")
    return name


def balanced(n: int = 40, labels: tuple = (0, 1)) -> list[tuple]:
    return [(f"good film {i}", labels[i % len(labels)]) for i in range(n)]


# --- the files ------------------------------------------------------------------------------------------------------


def test_the_tiny_project_has_no_problem(project):
    assert problems() == []


def test_a_missing_data_file_is_named_with_the_nearest_existing_name(project):
    line = only(problems(data={"source": "dta.csv"}))
    assert line.startswith("data.source: no file or folder dta.csv (did you mean data.csv?); expected default")


@pytest.mark.parametrize("name", ["default", "trec", "disaster-tweets"])
def test_the_offline_tasks_are_accepted_by_name(project, name):
    assert problems(data={"source": name}) == []


def test_an_unknown_offline_task_name_gets_one_line_with_the_nearest_name_and_what_is_allowed(project):
    assert only(problems(data={"source": "trecc"})) == (
        "data.source: no offline task or file trecc (did you mean trec?); expected default, trec, disaster-tweets, "
        "glue/<task> or a local CSV/TSV/JSON/JSONL file or folder")
    assert only(problems(data={"source": "imdb"})).startswith(
        "data.source: no file or folder imdb; expected default, trec, disaster-tweets, glue/<task> or a local")


def test_a_file_that_is_not_utf8_names_the_byte_and_its_line(project):
    Path("latin1.csv").write_bytes("text,label\nfine,1\ncaf\xe9 cr\xe8me,0\n".encode("latin-1"))
    assert only(problems(data={"source": "latin1.csv"})) == (
        "data.source: latin1.csv: not UTF-8 text (byte 0xe9 on line 3); save it as UTF-8")


def test_a_csv_row_with_a_stray_comma_names_its_line_and_the_header(project):
    Path("ragged.csv").write_text("text,label\ngood,1\ngood, really,1\n")
    assert "ragged.csv: line 3 has 3 field(s); the header has 2 (text, label)" in only(
        problems(data={"source": "ragged.csv"}))


def test_invalid_json_names_the_line_and_column(project):
    Path("data.jsonl").write_text('{"text": "good", "label": 1}\n{"text": "bad" "label": 0}\n')
    assert "data.jsonl: line 2 is not valid JSON (column 16: Expecting ',' delimiter)" in only(
        problems(data={"source": "data.jsonl"}))


def test_a_missing_label_column_lists_the_columns_found(project):
    write_csv("sentiment.csv", balanced(), header="text,sentiment")
    assert only(problems(data={"source": "sentiment.csv"})) == (
        "data: sentiment.csv: missing column(s) ['label']; available columns: ['text', 'sentiment']")


def test_empty_text_and_labels_are_counted_and_their_lines_named(project):
    write_csv("holes.csv", [*balanced(), ("", 1), ("   ", 0)])
    assert only(problems(data={"source": "holes.csv"})) == (
        "data: holes.csv: 2 row(s) with no text in column 'text' (lines 42, 43)")
    write_csv("nan.csv", [*balanced(), ("fine", "NaN"), ("fine", "")])
    assert "nan.csv: 2 row(s) without a label in column 'label' (lines 42, 43)" in only(
        problems(data={"source": "nan.csv"}))


@pytest.mark.parametrize(("labels", "message"), [
    ((1, 2), "class ids must run 0..K-1, each occurring in train; labels.csv has [1, 2] (no [0])"),
    ((0, 0.5), "labels must be class ids (integers >= 0) or names; '0.5'"),
    ((0, "pos"), "mix class ids (lines 2, 4 and 18 more) and names (lines 3, 5 and 18 more)"),
    ((0, -1), "class ids must be integers >= 0; 20 row(s) have [-1]"),
])
def test_labels_that_are_not_the_class_ids_the_task_expects_are_refused(project, labels, message):
    write_csv("labels.csv", balanced(labels=labels))
    assert message in only(problems(data={"source": "labels.csv"}))


def test_string_labels_become_ids_and_keep_their_names(project):
    from pipeline.tasks.classification.data import TaskSpec, load_task

    write_csv("names.csv", balanced(labels=("pos", "neg")))
    assert problems(data={"source": "names.csv"}) == []
    dsd, info = load_task(TaskSpec("names.csv"))
    assert info.label_names == ("neg", "pos") and set(dsd["train"]["label"]) == {0, 1}


def test_a_task_of_one_class_is_refused_before_any_training(project):
    write_csv("one.csv", balanced(labels=(0,)))
    assert only(problems(data={"source": "one.csv"})) == (
        "data.label_column: every label in one.csv is '0': a task of one class can be neither learnt nor scored; "
        "give examples of two classes at least")


def test_too_few_examples_for_the_splits_are_refused(project):
    write_csv("few.csv", balanced(n=6))
    assert "dev would hold 0 example(s) of 0 class(es) (carved out of 6 training rows" in only(
        problems(data={"source": "few.csv"}))


def test_a_class_in_test_that_train_lacks_is_refused(project):
    Path("splits").mkdir()
    write_csv("splits/train.csv", balanced(labels=(0, 1)))
    write_csv("splits/test.csv", balanced(labels=(0, 2)))
    assert "splits/test.csv: class id(s) [2] never occur in train (train has [0, 1])" in only(
        problems(data={"source": "splits"}))


# --- the model --------------------------------------------------------------------------------------------------------


def test_a_missing_model_folder_is_named(project):
    assert only(problems(model={"name_or_path": "./models/bert"})) == (
        "model.name_or_path: no file or folder ./models/bert; expected a model folder, a hub id, or default")


def test_a_folder_without_a_config_is_not_a_model(project):
    Path("notes").mkdir()
    (Path("notes") / "README.md").write_text("my model")
    assert only(problems(model={"name_or_path": "notes"})).startswith(
        "model.name_or_path: notes is not a model folder: it has no config.json (found: README.md)")


def test_an_unsupported_family_is_refused_in_prepare_with_the_supported_ones_listed(project):
    Path("pythia").mkdir()
    (Path("pythia") / "config.json").write_text(json.dumps({"model_type": "gpt_neox"}))
    (Path("pythia") / "model.safetensors").write_bytes(SAFETENSORS_WITH_NO_TENSORS)
    (Path("pythia") / "tokenizer.json").write_text("{}")
    line = only(problems(model={"name_or_path": "pythia"}))
    assert line.startswith("model.name_or_path: pythia is a gpt_neox model, which the head-surgery core does not "
                           "support; "
                           "supported families (config.json model_type): bart, bert, distilbert, electra,")


def test_a_gemma_3_text_folder_passes_the_family_check_and_the_multimodal_gemma_3_is_refused(project):
    for name, model_type in (("gemma", "gemma3_text"), ("gemma-vision", "gemma3")):
        Path(name).mkdir()
        (Path(name) / "config.json").write_text(json.dumps({"model_type": model_type}))
        save_file({"weight": torch.zeros(1)}, Path(name) / "model.safetensors")
        (Path(name) / "tokenizer.json").write_text("{}")
    assert lm_problems("gemma") == []
    assert only(lm_problems("gemma-vision")).startswith(
        "model.name_or_path: gemma-vision is a gemma3 model, which the head-surgery core does not support")


def test_a_hub_id_or_glue_task_while_the_hub_is_unreachable_says_so_and_how_to_use_local_files(project):
    model, data = problems(model={"name_or_path": "bert-base-uncased"}, data={"source": "glue/mnli"})
    assert model.startswith("model.name_or_path: 'bert-base-uncased' is no local folder, so it names a Hugging Face "
                            "hub model, but the hub is unreachable from here (127.0.0.1:9: Connection refused)")
    assert "point it at local files instead" in model
    assert data.startswith("data.source: glue/mnli is read from the Hugging Face hub (nyu-mll/glue), which is "
                           "unreachable from here")


def test_every_problem_is_listed_not_just_the_first(project):
    found = problems(model={"name_or_path": "./nope"}, data={"source": "nope.csv"})
    assert [line.split(":")[0] for line in found] == ["model.name_or_path", "data.source"]


# --- translation ------------------------------------------------------------------------------------------------------


def translation_problems(**data) -> list[str]:
    params = yaml.safe_load((ROOT / "mt" / "params.yaml").read_text())
    params["data"].update(data)
    Path("mt.yaml").write_text(yaml.safe_dump(params))
    return check_all("mt.yaml")


def test_a_translation_file_with_a_missing_sentence_names_the_line(project):
    Path("pairs.tsv").write_text("source\ttarget\n" + "".join(f"hello {i}\thola {i}\n" for i in range(30))
                                 + "one more line\n")
    assert "pairs.tsv: line 32 has 1 field(s); the header has 2 (source, target): a stray or missing tab?" in only(
        translation_problems(source="pairs.tsv"))


def test_parallel_text_files_with_mismatched_line_counts_are_refused(project):
    from pipeline.tasks.translation.data import load_translation_task

    Path("corpus").mkdir()
    Path("corpus/train.en").write_text("".join(f"hello {i}\n" for i in range(30)))
    Path("corpus/train.es").write_text("".join(f"hola {i}\n" for i in range(30)))
    assert translation_problems(source="corpus") == []
    dsd = load_translation_task("corpus", "en", "es", seed=0)
    assert sum(map(len, dsd.values())) == 30 and dsd["train"][0]["target"].startswith("hola")
    Path("corpus/train.es").write_text("".join(f"hola {i}\n" for i in range(29)))
    assert only(translation_problems(source="corpus")) == (
        "data.source: corpus/train.en has 30 lines and corpus/train.es 29; parallel files hold one sentence per line, "
        "line i of each a translation pair")


def test_a_fairseq_checkpoint_that_does_not_exist_is_named(project):
    params = yaml.safe_load((ROOT / "mt-fairseq" / "params.yaml").read_text())
    params["model"].update(checkpoint="missing/model.pt", data_bin="missing-bin")
    Path("fs.yaml").write_text(yaml.safe_dump(params))
    assert check_all("fs.yaml") == [
        "model.checkpoint: no file missing/model.pt; expected the .pt file written by fairseq-train",
        "model.data_bin: no folder missing-bin; expected the output folder of fairseq-preprocess (dict.<lang>.txt "
        "and the binarised splits)"]


def copy_of_tiny_model(name: str, **config_changes) -> str:
    """The tiny model's files under `name`, its config.json with `config_changes`."""
    Path(name).mkdir()
    for file in Path("tiny_model").iterdir():
        (Path(name) / file.name).symlink_to(file.resolve())
    config = json.loads((Path("tiny_model") / "config.json").read_text())
    (Path(name) / "config.json").unlink()
    (Path(name) / "config.json").write_text(json.dumps({**config, **config_changes}))
    return name


@pytest.mark.parametrize(("quantization", "method"), [
    ({"quant_method": "gguf", "gguf_file": "model.Q4_1.gguf"}, "gguf"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "bitsandbytes"),
    ({"quant_method": "gptq", "bits": 4}, "gptq"),
    ({"quant_method": "awq", "bits": 4}, "awq"),
    ({"bits": 8}, "not named"),
])
def test_a_quantized_checkpoint_is_refused_in_one_line_naming_its_method_and_what_to_use(project, quantization,
                                                                                        method):
    folder = copy_of_tiny_model("quantized", quantization_config=quantization)
    assert only(problems(model={"name_or_path": folder})) == (
        f"model.name_or_path: quantized is a quantized checkpoint (config.json has quantization_config, quant_method "
        f"{method}), which can be neither pruned nor saved; a GGUF file or folder is converted by prepare: name the "
        f".gguf file instead; a bitsandbytes, GPTQ, AWQ or other quantized checkpoint: use the unquantised model")


def test_weights_that_are_absent_or_unreadable_are_named(project):
    folder = copy_of_tiny_model("broken")
    (Path(folder) / "model.safetensors").unlink()
    assert only(problems(model={"name_or_path": folder})).startswith(
        "model.name_or_path: broken has a config.json but no weights (expected one of model.safetensors,")
    (Path(folder) / "model.safetensors").write_bytes(b"\x00" * 5)
    assert only(problems(model={"name_or_path": folder})) == (
        "model.name_or_path: broken/model.safetensors is not a readable safetensors file (its header is cut short); "
        "copy or save the model again")
    (Path(folder) / "model.safetensors").write_bytes((4).to_bytes(8, "little") + b"{no}")
    assert "(its header is not JSON)" in only(problems(model={"name_or_path": folder}))


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    """A tiny Llama as a GGUF file (tests/tiny_gguf.py): 2 layers of 9 query heads in 3 key/value groups."""
    from tests.tiny_gguf import tiny_gqa_llama, write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", tiny_gqa_llama())


def test_a_gguf_file_and_a_folder_holding_one_pass_the_checks_for_prepare_converts_them(project, tiny_gguf):
    Path("llm").mkdir()
    (Path("llm") / "model.gguf").symlink_to(tiny_gguf)
    assert lm_problems("llm/model.gguf") == []
    assert lm_problems("llm") == []


def test_a_gguf_file_that_prepare_could_not_convert_is_named_in_one_line(project, tiny_gguf):
    Path("fake.gguf").write_bytes(b"PK\x03\x04")
    assert only(lm_problems("fake.gguf")) == (
        "model.name_or_path: fake.gguf is not a GGUF file (it does not start with GGUF)")
    from tests.tiny_gguf import tiny_gqa_llama, write_tiny_gguf

    write_tiny_gguf(Path("bare.gguf"), tiny_gqa_llama(), tokenizer=False)
    assert only(lm_problems("bare.gguf")) == (
        "model.name_or_path: bare.gguf holds no tokenizer (no tokenizer.ggml.* metadata), which prepare needs to "
        "convert it into a model folder")
    Path("two").mkdir()
    for name in ("a.gguf", "b.gguf"):
        (Path("two") / name).symlink_to(tiny_gguf)
    assert only(lm_problems("two")).startswith(
        "model.name_or_path: two is not a model folder: it has no config.json (found: a.gguf, b.gguf); expected a "
        "Hugging Face model folder (save_pretrained's) or a folder holding one .gguf file")


def test_a_gguf_file_of_an_unsupported_architecture_is_refused(project):
    import gguf

    writer = gguf.GGUFWriter("mamba.gguf", "mamba")
    writer.add_tokenizer_model("gpt2")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    assert only(problems(model={"name_or_path": "mamba.gguf"})).startswith(
        "model.name_or_path: mamba.gguf is a GGUF file of architecture mamba, which the head-surgery core does not "
        "read from GGUF; supported architectures (llama.cpp's names): gemma3, gpt2, llama, qwen2, qwen3")


# --- damaged weights: the user's file named, nothing written -------------------------------------------------------


def test_a_truncated_model_safetensors_is_named_as_the_users_file(project):
    folder = copy_of_tiny_model("cut")
    weights = Path(folder) / "model.safetensors"
    data = weights.read_bytes()
    weights.unlink()  # a link to the shared tiny model: cut a copy
    weights.write_bytes(data[:-100])
    assert only(problems(model={"name_or_path": folder})) == (
        f"model.name_or_path: cut/model.safetensors is not a readable safetensors file (it is truncated: its tensors "
        f"end at byte {len(data):,}, but the file has {len(data) - 100:,} bytes); copy or save the model again")


def sharded_copy_of_tiny_model(name: str) -> Path:
    """The tiny model saved in shards of a few KB, as large checkpoints are (model.safetensors.index.json)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained("tiny_model")
    model.save_pretrained(name, max_shard_size="8KB")
    AutoTokenizer.from_pretrained("tiny_model").save_pretrained(name)
    return Path(name)


def test_a_sharded_folder_missing_a_shard_or_with_a_truncated_one_is_named_shard_by_shard(project):
    folder = sharded_copy_of_tiny_model("sharded")
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) > 2 and problems(model={"name_or_path": str(folder)}) == []
    shards[1].unlink()
    shards[2].write_bytes(shards[2].read_bytes()[:-1])
    found = problems(model={"name_or_path": str(folder)})
    assert found[0] == (f"model.name_or_path: {shards[1]} is missing: model.safetensors.index.json names it as one of "
                        f"the model's {len(shards)} shards; copy the whole folder again")
    assert found[1].startswith(f"model.name_or_path: {shards[2]} is not a readable safetensors file (it is truncated")
    assert len(found) == 2


def test_a_truncated_gguf_is_named_as_the_users_file(project, tiny_gguf):
    import gguf

    from tests.tiny_gguf import tiny_gqa_llama, write_tiny_gguf

    last = max(gguf.GGUFReader(tiny_gguf).tensors, key=lambda t: t.data_offset)
    write_tiny_gguf(Path("cut.gguf"), tiny_gqa_llama(), truncate=1000)
    assert only(lm_problems("cut.gguf")) == (
        f"model.name_or_path: cut.gguf is a damaged GGUF file (its tensors end at byte "
        f"{last.data_offset + last.n_bytes:,} ({last.name}), but the file has {tiny_gguf.stat().st_size - 1000:,} "
        f"bytes); copy or download it again")


@pytest.mark.parametrize("damage", ["truncated-gguf", "truncated-safetensors", "missing-shard"])
def test_python_m_pipeline_checks_refuses_damaged_weights_in_one_line_writing_nothing(project, tiny_gguf, damage):
    """The issue's three damaged inputs, through the real command: one error line naming the user's file, no
    artifacts/ or reports/ folder, and dvc.lock untouched."""
    from tests.tiny_gguf import tiny_gqa_llama, write_tiny_gguf

    if damage == "truncated-gguf":
        name, bad = "cut.gguf", "cut.gguf"
        write_tiny_gguf(Path(name), tiny_gqa_llama(), truncate=1000)
        lm_problems(name)  # writes llm.yaml
        params = "llm.yaml"
    else:
        folder = copy_of_tiny_model("cut") if damage == "truncated-safetensors" else sharded_copy_of_tiny_model("cut")
        bad = sorted(Path(folder).glob("model*.safetensors"))[-1]
        if damage == "missing-shard":
            bad.unlink()
        else:
            data = bad.read_bytes()
            bad.unlink()  # a link to the shared tiny model when not sharded: cut a copy
            bad.write_bytes(data[:-10])
        problems(model={"name_or_path": str(folder)})
        params = "params.yaml"
    Path("dvc.lock").write_text("unchanged\n")
    result = run(["-m", "pipeline.checks", "--params", params], project)
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"error: model.name_or_path: {bad} ") and "Traceback" not in result.stderr
    assert "output of stage" not in result.stderr  # the user's input, not a pipeline output
    assert not Path("artifacts").exists() and not Path("reports").exists()
    assert Path("dvc.lock").read_text() == "unchanged\n"


# --- levels to save that the model's shape cannot take ------------------------------------------------------------


def lm_problems(name_or_path: str = "default", **prune) -> list[str]:
    """check_all on the language-modelling params (llm/params.yaml) with a pretrained model and prune updated (up to
    90% of the heads)."""
    params = yaml.safe_load((ROOT / "llm" / "params.yaml").read_text())
    params["model"] = {"name_or_path": name_or_path}
    params["prune"].update({"max_fraction": 0.9, **prune})
    Path("llm.yaml").write_text(yaml.safe_dump(params))
    return check_all("llm.yaml")


LEVELS = "the levels it can save are 0.333, 0.667"


def test_uniform_levels_that_9_query_heads_in_3_groups_cannot_take_are_refused_naming_those_they_can(project):
    found = lm_problems(uniform=True, save_fractions=[0.25, 0.33, 0.67], kv_group_fractions=[0.5])
    assert found == [
        "prune.save_fractions: 0.25 of the heads cannot go alike from 30 attention layers of 9 query heads in 3 "
        f"key/value groups, taken in whole units of 3 (one from each group); {LEVELS}",
        "prune.kv_group_fractions: 0.5 of the heads cannot go alike from 30 attention layers of 9 query heads in 3 "
        f"key/value groups, taken in whole groups of 3; {LEVELS}"]
    assert lm_problems(uniform=True, save_fractions=[0.333, 0.667], kv_group_fractions=[0.333]) == []
    assert lm_problems(uniform=False, save_fractions=[0.25, 0.5, 0.75], kv_group_fractions=[0.667]) == []


def test_the_shape_is_read_from_a_gguf_header_a_config_and_a_scratch_model_s_params(project, tiny_gguf):
    from pipeline.core.gguf import convert_gguf

    converted = convert_gguf(tiny_gguf, Path("converted"))
    for model in (str(tiny_gguf), str(converted)):
        assert lm_problems(model, uniform=True, save_fractions=[0.5], kv_group_fractions=[]) == [
            "prune.save_fractions: 0.5 of the heads cannot go alike from 2 attention layers of 9 query heads in 3 "
            f"key/value groups, taken in whole units of 3 (one from each group); {LEVELS}"]
    # The scratch Llama: 6 layers of 8 heads in 2 groups.
    params = yaml.safe_load((ROOT / "experiments" / "tatoeba-llama.yaml").read_text())
    params["prune"].update(uniform=True, save_fractions=[0.25, 0.3], kv_group_fractions=[0.5])
    Path("scratch.yaml").write_text(yaml.safe_dump(params))
    assert [line.split(";")[-1] for line in check_all("scratch.yaml")] == [
        " the levels it can save are 0.25, 0.5, 0.75"]


def test_a_level_that_rounds_to_no_head_is_refused(project):
    assert lm_problems(save_fractions=[0.005], kv_group_fractions=[]) == [
        "prune.save_fractions: 0.005 of 270 heads is 1, less than one unit of 3, so the saved model would be the "
        "unpruned one; the smallest level is 0.0111"]
    assert only(problems(prune={"save_fractions": [0.05]})) == (  # the tiny BERT: 8 heads, one at a time
        "prune.save_fractions: 0.05 of 8 heads is 0, less than one unit of 1, so the saved model would be the unpruned "
        "one; the smallest level is 0.125")


# --- what a user sees -------------------------------------------------------------------------------------------------


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = tool_env({"HF_ENDPOINT": CLOSED_PORT, "PYTHONPATH": str(ROOT)})
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_prepare_refuses_a_missing_data_file_in_one_line_before_torch_loads_and_writes_nothing(project):
    problems(data={"source": "missing.csv"})
    result = run(["-X", "importtime", "-m", "stages.prepare"], project)
    lines = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
    assert result.returncode == 1 and lines == [
        "error: data.source: no file or folder missing.csv; expected default, trec, disaster-tweets, glue/<task> "
        "or a local CSV/TSV/JSON/JSONL file or folder"]
    assert "| torch" not in result.stderr and "| transformers" not in result.stderr
    assert not (project / "artifacts").exists()


def test_the_checks_command_lists_every_problem_and_a_later_stage_refuses_bad_params(project):
    problems(model={"name_or_path": "./nope"}, data={"source": "nope.csv"})
    checked = run(["-m", "pipeline.checks"], project)
    assert checked.returncode == 1 and len(checked.stderr.splitlines()) == 2
    assert "Traceback" not in checked.stderr
    problems(prune={"step": 2})
    score = run(["-m", "stages.score"], project)
    assert score.returncode == 1 and score.stderr.splitlines() == [
        "error: invalid params: prune.step: Input should be less than or equal to 0.5 (got 2)"]


def test_a_hub_model_is_checked_from_its_config_alone_when_the_hub_is_reachable(project, monkeypatch):
    import huggingface_hub

    from pipeline.data import inputs

    Path("pythia.json").write_text(json.dumps({"model_type": "gpt_neox"}))
    fetched = []
    monkeypatch.setattr(inputs, "hub_unreachable", lambda: None)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda repo, name: fetched.append((repo, name)) or
                        "pythia.json")
    assert only(problems(model={"name_or_path": "EleutherAI/pythia-70m"})).startswith(
        "model.name_or_path: EleutherAI/pythia-70m is a gpt_neox model, which the head-surgery core does not support")
    assert fetched == [("EleutherAI/pythia-70m", "config.json")]


def test_prepare_refuses_a_quantized_checkpoint_in_one_line_before_torch_loads_and_writes_nothing(project):
    problems(model={"name_or_path": copy_of_tiny_model("quantized", quantization_config={"quant_method": "gptq"})})
    result = run(["-X", "importtime", "-m", "stages.prepare"], project)
    lines = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
    assert result.returncode == 1 and len(lines) == 1
    assert lines[0].startswith("error: model.name_or_path: quantized is a quantized checkpoint (config.json has "
                               "quantization_config, quant_method gptq)")
    assert "| torch" not in result.stderr and "| transformers" not in result.stderr
    assert not (project / "artifacts").exists()


# --- what each family accepts (its inputs module's ACCEPTS) ---------------------------------------------------------


def tiny_gpt2(name: str) -> str:
    """A random 2-layer GPT-2 folder with the tiny model's tokenizer: a family the core prunes, for language
    modelling."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained("tiny_model")
    config = transformers.GPT2Config(vocab_size=tokenizer.vocab_size, n_embd=16, n_layer=2, n_head=4, n_inner=24,
                                     n_positions=32, bos_token_id=0, eos_token_id=0)
    transformers.GPT2LMHeadModel(config).save_pretrained(name)
    tokenizer.save_pretrained(name)
    return name


def assert_refused_in_one_line_with_nothing_written(result: subprocess.CompletedProcess, project: Path) -> str:
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert not (project / "artifacts").exists() and not (project / "reports").exists()
    return result.stderr.removeprefix("error: ").rstrip("\n")


def test_a_gpt2_folder_in_the_classification_pipeline_is_refused_in_one_line_with_nothing_written(project):
    problems(model={"name_or_path": tiny_gpt2("gpt2")})
    line = assert_refused_in_one_line_with_nothing_written(run(["-m", "stages.prepare"], project), project)
    assert line == ("model.name_or_path: gpt2 is a gpt2 model, which the classification task does not take; allowed: "
                    "bert, distilbert, electra, mpnet, roberta")


def test_a_class_with_a_single_row_is_refused_in_one_line_with_nothing_written(project):
    problems(data={"source": write_csv("single.csv", [*balanced(), ("odd film", 2)])})
    line = assert_refused_in_one_line_with_nothing_written(run(["-m", "stages.prepare"], project), project)
    assert line == (
        "data.label_column: single.csv: class '2' has 1 row(s) in column 'label'; the stratified split by "
        "data.fractions [0.8, 0.1, 0.1] needs 7 rows of each class so that dev and test each hold at least 1 of it; "
        "give more examples of it, or leave it out")


def test_seven_rows_a_class_are_the_fewest_from_which_the_default_split_gives_dev_and_test_each_class(project):
    from pipeline.tasks.classification.inputs import read_classification

    for rows in (6, 7, 8, 9, 10):
        write_csv("rare.csv", [*balanced(labels=("neg", "pos")), *[(f"rare film {i}", "rare") for i in range(rows)]])
        found = problems(data={"source": "rare.csv"})
        if rows < 7:
            assert "class 'rare' has 6 row(s) in column 'label'" in only(found)
            continue
        assert found == []
        task = read_classification("rare.csv", None, ["text"], "label", (0.8, 0.1, 0.1), seed=0)
        rare = task.label_names.index("rare")
        assert all(rare in task.ids[given][where] for given, where in task.plan.values())  # every split holds it


def test_a_class_of_a_given_dev_file_needs_only_the_rows_that_carving_test_takes(project):
    Path("given").mkdir()
    write_csv("given/train.csv", [*balanced(), *[("rare film", 2)] * 5])
    write_csv("given/dev.csv", balanced(n=10, labels=(0, 1, 2)))
    assert problems(data={"source": "given"}) == []
    write_csv("given/train.csv", [*balanced(), *[("rare film", 2)] * 4])
    assert "class '2' has 4 row(s) in column 'label'; the stratified split by data.fractions [0.8, 0.1, 0.1] needs 5 " \
           "rows of each class so that test holds at least 1 of it" in only(problems(data={"source": "given"}))


def test_an_encoder_folder_is_refused_by_the_language_modelling_and_translation_pipelines(project):
    assert only(lm_problems("tiny_model", save_fractions=[0.5], kv_group_fractions=[])) == (
        "model.name_or_path: tiny_model is a bert model, which the language-modeling task does not take; allowed: "
        "gemma3_text, gpt2, llama, mistral, opt, qwen2, qwen3")
    params = yaml.safe_load((ROOT / "mt" / "params.yaml").read_text())
    params["model"] = {"name_or_path": "tiny_model"}
    Path("mt.yaml").write_text(yaml.safe_dump(params))
    assert only(check_all("mt.yaml")).startswith(
        "model.name_or_path: tiny_model is a bert model, which the translation task does not take; allowed: bart, "
        "marian")
    assert lm_problems(tiny_gpt2("gpt2"), save_fractions=[0.5], kv_group_fractions=[]) == []


def test_each_family_takes_the_core_families_whose_head_its_stages_load():
    """Classification takes the families with a sequence-classification head (the encoders), language modelling the
    causal LMs, translation the generating encoder-decoders: tests/tiny_models.py builds each family with its head."""
    from pipeline.config.tasks import TASK_PACKAGES
    from pipeline.core.sites import FAMILIES
    from pipeline.files.schema import CLASSIFICATION, LANGUAGE_MODELING, TRANSLATION
    from tests.tiny_models import CONFIGS

    heads = {CLASSIFICATION: ("ForSequenceClassification",), LANGUAGE_MODELING: ("ForCausalLM", "LMHeadModel"),
             TRANSLATION: ("MTModel", "ForConditionalGeneration")}
    for task, package in TASK_PACKAGES.items():
        accepts = importlib.import_module(f"{package}.inputs").ACCEPTS
        assert accepts.task == task and set(accepts.model_families) <= set(FAMILIES)
        with_head = {t for t, (_, _, model_class) in CONFIGS.items() if model_class.__name__.endswith(heads[task])}
        assert set(accepts.model_families) == with_head, task


def test_sharded_placement_is_refused_for_a_classification_model_in_one_line(project):
    found = problems(runtime={"placement": "sharded"})
    assert "runtime.placement: sharded is not run by the classification task; allowed: whole" in only(found)


def test_sharded_placement_is_refused_for_a_translation_model(project):
    params = tiny_mt_params()
    params["runtime"]["placement"] = "sharded"
    Path("mt.yaml").write_text(yaml.safe_dump(params))
    refusal = "runtime.placement: sharded is not run by the translation task; allowed: whole"
    assert any(line.startswith(refusal) for line in check_all("mt.yaml"))
