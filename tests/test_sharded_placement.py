"""runtime.placement sharded: a model placed by accelerate (some layers on the CPU, the rest offloaded to disk, as a
node's GPUs then its CPU and disk would hold a model too large for one device) scores, evaluates and decodes as the
whole model does."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest
import torch

from pipeline.core.checkpoint import save_model
from pipeline.core.importance import head_importance, token_head_importance
from pipeline.core.placement import device_map, input_device, load_sharded
from pipeline.core.runtime import Runtime
from pipeline.core.surgery import prune_heads
from pipeline.files.schema import OFFLOAD_DIR
from pipeline.methods.llm_bench import llm_benchmark
from pipeline.tasks.language_modeling.llama import collate_texts
from pipeline.tasks.language_modeling.perplexity import LanguageModelEval
from pipeline.tasks.language_modeling.task import LanguageModelingTask
from tests.tiny_models import PAD, VOCAB, tiny_model

# The tiny Llama's embeddings take 12 KB and each of its 3 layers 30 KB: 75 KB of CPU leaves the embeddings and layer
# 0 on the CPU and offloads layers 1 and 2, the final norm and the (tied) output layer to disk.
SHARDED = Runtime(placement="sharded", max_memory=(("cpu", "75KB"), ("disk", "1GB")))


def texts(n: int = 10, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, 12, (n,), generator=g)
    return [torch.randint(3, VOCAB, (int(k),), generator=g).tolist() for k in lengths]


def score_batches() -> list[dict[str, torch.Tensor]]:
    sequences = texts(8, seed=1)
    return [collate_texts(sequences[i : i + 4], PAD) for i in range(0, 8, 4)]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The tiny Llama saved as a stock folder, and pruned unevenly across layers (the project's own format)."""
    root = tmp_path_factory.mktemp("sharded")
    whole = tiny_model("llama")
    # one query head of each key/value group in layer 0, a whole group in layer 2: not a stock shape
    pruned = prune_heads(tiny_model("llama"), {0: [0, 4], 2: [4, 5, 6, 7]})
    return {"stock": (whole, save_model(whole, root / "stock")),
            "pruned": (pruned, save_model(pruned, root / "pruned")), "offload": root / "offload"}


@pytest.mark.parametrize("form", ["stock", "pruned"])
def test_a_sharded_model_puts_layers_on_the_cpu_and_on_disk_and_takes_its_inputs_on_the_cpu(folders, form):
    _, path = folders[form]
    model = load_sharded(path, SHARDED, folders["offload"])
    placed = device_map(model)
    assert placed["model.embed_tokens"] == "cpu" and "disk" in placed.values(), placed
    assert input_device(model) == torch.device("cpu")
    assert any(p.device.type == "meta" for p in model.parameters())  # offloaded weights live on disk, not in memory


@pytest.mark.parametrize("form", ["stock", "pruned"])
def test_a_sharded_model_has_the_whole_models_perplexity(folders, form):
    whole, path = folders[form]
    model = load_sharded(path, SHARDED, folders["offload"])
    evaluation = LanguageModelEval(texts(), PAD, batch_size=4)
    assert evaluation(model)[0] == pytest.approx(evaluation(whole)[0], rel=1e-6)


def test_a_sharded_model_has_the_whole_models_head_importance_per_example_and_per_token(folders):
    whole, path = folders["stock"]
    model = load_sharded(path, SHARDED, folders["offload"])
    for got, want in zip(head_importance(model, score_batches(), progress=False),
                         head_importance(whole, score_batches(), progress=False), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-8)
        assert got.device.type == "cpu"
    sharded_token, sharded_example = token_head_importance(model, score_batches(), progress=False)
    whole_token, whole_example = token_head_importance(whole, score_batches(), progress=False)
    for got, want in zip([*sharded_token, *sharded_example], [*whole_token, *whole_example], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-8)


def test_the_decode_benchmark_runs_on_a_sharded_model_and_counts_the_offloaded_weights(folders):
    whole, path = folders["stock"]
    model = load_sharded(path, SHARDED, folders["offload"])
    table = llm_benchmark({"whole": whole, "sharded": model}, batch_sizes=[2], prompt_tokens=6, new_tokens=3,
                          repeats=1)
    assert len(table) == 4 and (table.tokens_per_s > 0).all()
    rows = table.set_index(["model", "phase"])
    assert rows.loc[("sharded", "decode"), "params"] == rows.loc[("whole", "decode"), "params"]
    assert rows.loc[("sharded", "decode"), "kv_bytes_per_token"] == rows.loc[("whole", "decode"), "kv_bytes_per_token"]


def test_a_sharded_models_offload_folder_goes_when_the_model_does(folders, tmp_path):
    _, path = folders["pruned"]  # a stock folder's tensors are read from its safetensors file; these are copied
    model = load_sharded(path, SHARDED, tmp_path / "offload")
    (folder,) = (tmp_path / "offload").iterdir()
    assert any(folder.iterdir())  # the disk-offloaded tensors
    del model
    gc.collect()
    assert not folder.exists()


@pytest.mark.parametrize("placement", ["whole", "sharded"])
def test_the_language_modelling_task_loads_its_models_by_the_runtimes_placement(folders, tmp_path, placement):
    runtime = SHARDED if placement == "sharded" else Runtime()
    exp = SimpleNamespace(runtime=runtime, artifacts=tmp_path, trust_remote_code=False,
                          params=SimpleNamespace(model=SimpleNamespace(attn_implementation="sdpa")))
    model = LanguageModelingTask(exp).load(folders["stock"][1])
    assert ("disk" in device_map(model).values()) is (placement == "sharded")
    assert (tmp_path / OFFLOAD_DIR).is_dir() is (placement == "sharded")
