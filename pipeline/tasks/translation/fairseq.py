"""fairseq Transformer translation models (the paper's own format) behind the head-surgery core.

`load_checkpoint` reads a checkpoint written by `fairseq-train` (or by `save_checkpoint` after pruning)
into a `FairseqSeq2Seq`: a thin module that gives fairseq's `TransformerModel` the calling convention the
core uses for Hugging Face encoder-decoders (`model(input_ids=..., labels=...).logits`, `model.config`,
`model.base_model`). Through it the core works unchanged on all three kinds of attention (encoder,
decoder, cross): `attention_sites`, `head_gates`, `head_importance` (token-level NLL, padding ignored),
`prune_heads` and the pruning curves of `pipeline.methods.pruning`. Decoding uses fairseq's own
`SequenceGenerator`; BLEU is sacrebleu's (`pipeline.tasks.translation.bleu.bleu`).

Trust: every fairseq checkpoint pickles Python objects (its config holds an `argparse.Namespace`), and
unpickling them can run code from the file. torch >= 2.6 refuses that by default, and so does
`load_checkpoint` unless called with `trust_checkpoint=True`; only pass it for files from a source you
trust, such as your own training runs.

Requires the `fairseq` extra (`fairseq-fixed`, the fork of fairseq 0.12 that runs on Python 3.11+).
"""

from __future__ import annotations

import copy
import io
import logging
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from pipeline.core.checkpoint import apply_pruning_record, check_pruned_shapes, pruning_record
from pipeline.core.runtime import CPU_FP32, Runtime
from pipeline.core.sites import UnsupportedModelError
from pipeline.files.atomic import write_bytes
from pipeline.files.schema import BLEU, EVAL_SPLITS, SPLITS
from pipeline.tasks.translation.bleu import bleu, bleu_paired_pvalue
from pipeline.tasks.translation.marian import collate_pairs, decoder_inputs

MODEL_TYPE = "fairseq_transformer"  # the key of this backend's entry in pipeline.core.sites.FAMILIES
PRUNING_KEY = "head_pruning"  # where save_checkpoint puts pipeline.core.checkpoint's pruning record


@contextmanager
def _logging_unchanged() -> Iterator[None]:
    """Keep importing fairseq from changing logging: some of its modules call `logging.basicConfig(level=DEBUG)`,
    which would switch every other library's log output on, at DEBUG, for the rest of the process."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {name: logger.level for name, logger in logging.root.manager.loggerDict.items()
              if isinstance(logger, logging.Logger)}
    if not handlers:
        # basicConfig does nothing to a root logger that has a handler. This one prints warnings, as Python
        # does when no handler is configured, so fairseq's INFO and DEBUG lines stay silent during the import.
        root.addHandler(logging.lastResort)
    try:
        yield
    finally:
        root.setLevel(level)
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
        for name, logger_level in levels.items():
            logging.getLogger(name).setLevel(logger_level)


# fairseq's own DeprecationWarnings at import (invalid escape sequences, torch.jit.script) are not the user's to fix.
with _logging_unchanged(), warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from fairseq import checkpoint_utils, tasks
    from fairseq.data import Dictionary, data_utils
    from fairseq.dataclass.utils import overwrite_args_by_name
    from fairseq.models.transformer import TransformerModel
    from fairseq.modules import MultiheadAttention
    from fairseq.sequence_generator import SequenceGenerator
    from omegaconf import DictConfig, OmegaConf, open_dict


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be loaded."""


class UntrustedCheckpointError(CheckpointError):
    """The checkpoint needs unpickling Python objects, and the caller did not say it trusts the file."""


class CorruptCheckpointError(CheckpointError):
    """The file is not a readable PyTorch checkpoint, or not a fairseq one."""


# --- the model ---------------------------------------------------------------------------------------


@dataclass
class FairseqModelConfig:
    """What the core and the pipeline read from `model.config`, for a fairseq model."""

    vocab_size: int
    pad_token_id: int
    eos_token_id: int
    max_position_embeddings: int  # of the decoder: the longest output it can produce
    model_type: str = MODEL_TYPE
    is_encoder_decoder: bool = True
    # fairseq has one attention implementation: batched matrix products (its fused path is switched off,
    # see FairseqSeq2Seq), which is what Hugging Face calls "eager"; the FLOP counter asks for that.
    _attn_implementation: str = field(default="eager", init=False)

    @property
    def decoder_start_token_id(self) -> int:
        return self.eos_token_id  # fairseq starts every target with </s>


@dataclass
class Seq2SeqOutput:
    logits: torch.Tensor  # [batch, target length, vocabulary]


def _check_supported(model: nn.Module) -> None:
    if not isinstance(model, TransformerModel):
        raise UnsupportedModelError(f"{type(model).__name__} is not a fairseq TransformerModel; the fairseq backend "
                                    f"supports encoder-decoder Transformers (arch transformer*)")
    for layer in model.decoder.layers:
        if (getattr(layer, "encoder_attn", None) is None or getattr(layer, "cross_self_attention", False)
                or getattr(layer, "c_attn", None) is not None):
            raise UnsupportedModelError("decoder layers without encoder attention, with cross_self_attention or "
                                        "with scale_heads are not supported")
    for module in model.modules():
        if isinstance(module, MultiheadAttention) and (
            module.bias_k is not None or module.add_zero_attn or module.use_xformers
        ):
            raise UnsupportedModelError("attention with add_bias_kv, add_zero_attn or xformers is not supported")


class FairseqSeq2Seq(nn.Module):
    """A fairseq TransformerModel with the calling convention of a Hugging Face encoder-decoder.

    `forward(input_ids, attention_mask, labels)` teacher-forces `labels` (padded with -100, ending in
    </s>) and returns `.logits`, as `pipeline.core.importance.per_example_loss` expects. `input_ids` are fairseq
    source tokens (ending in </s>), padded with the dictionary's pad token on either side; fairseq derives
    the padding mask from the pad token, so `attention_mask` is only checked against it.
    """

    def __init__(self, model: TransformerModel, cfg: DictConfig, src_dict: Dictionary, tgt_dict: Dictionary):
        super().__init__()
        _check_supported(model)
        if (src_dict.pad(), src_dict.eos()) != (tgt_dict.pad(), tgt_dict.eos()):
            raise UnsupportedModelError("the source and target dictionaries must share the pad and </s> indices")
        self.model = model
        self.cfg, self.src_dict, self.tgt_dict = cfg, src_dict, tgt_dict
        self.config = FairseqModelConfig(vocab_size=len(tgt_dict), pad_token_id=tgt_dict.pad(),
                                         eos_token_id=tgt_dict.eos(),
                                         max_position_embeddings=model.max_decoder_positions())
        # Self-attention in fairseq's MultiheadAttention otherwise runs F.multi_head_attention_forward, which
        # reads out_proj.weight without calling out_proj: the core's gates (hooks on out_proj) would never run,
        # so masking would do nothing and the gates would get no gradient. This flag selects its unfused path
        # (the same maths), here and for good, so that every output of the model comes from that one path.
        for module in model.modules():
            if isinstance(module, MultiheadAttention):
                module._set_skip_embed_dim_check()
        self.eval()

    @property
    def base_model(self) -> TransformerModel:
        return self.model  # where pipeline.core.sites looks for the layers, as in Hugging Face models

    def set_attn_implementation(self, implementation: str) -> None:
        if implementation != "eager":
            raise ValueError(f"fairseq models have eager attention only; got {implementation!r}")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, decoder_input_ids: torch.Tensor | None = None) -> Seq2SeqOutput:
        pad, eos = self.config.pad_token_id, self.config.eos_token_id
        # Inputs go where the model is (a GPU when Experiment.load put it there), as Hugging Face models expect.
        device = next(self.parameters()).device
        input_ids = input_ids.to(device)
        labels = labels.to(device) if labels is not None else None
        decoder_input_ids = decoder_input_ids.to(device) if decoder_input_ids is not None else None
        attention_mask = attention_mask.to(device) if attention_mask is not None else None
        not_pad = input_ids.ne(pad)
        if attention_mask is not None and not torch.equal(attention_mask.bool(), not_pad):
            raise ValueError("fairseq masks exactly the source's pad tokens; attention_mask disagrees with them")
        if decoder_input_ids is None:
            if labels is None:
                raise ValueError("give labels (teacher forcing) or decoder_input_ids")
            decoder_input_ids = decoder_inputs(labels, start_id=eos, pad_id=pad)
        logits, _extra = self.model(input_ids, not_pad.sum(dim=1), decoder_input_ids, return_all_hiddens=False)
        return Seq2SeqOutput(logits=logits)

    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, num_beams: int = 1,
                 do_sample: bool = False, min_new_tokens: int = 0, max_new_tokens: int = 64) -> torch.Tensor:
        """Hugging Face's `generate` with fairseq's SequenceGenerator, for the decoding benchmark
        (`pipeline.methods.bench.measure_generation`); returns each sentence's best hypothesis, padded with pad.

        As in Hugging Face, `max_new_tokens` counts the decoder steps: outputs have at most that many tokens,
        </s> included, and at least `min_new_tokens` (so equal bounds make every model do the same work).
        """
        if do_sample:
            raise ValueError("the fairseq backend decodes by beam search only (do_sample=False)")
        pad = self.config.pad_token_id
        input_ids = input_ids.to(next(self.parameters()).device)
        not_pad = input_ids.ne(pad)
        if attention_mask is not None and not torch.equal(attention_mask.bool().to(not_pad.device), not_pad):
            raise ValueError("fairseq masks exactly the source's pad tokens; attention_mask disagrees with them")
        # SequenceGenerator runs max_len_b + 1 steps and forbids </s> before step min_len.
        generator = SequenceGenerator([self.model], self.tgt_dict, beam_size=num_beams, max_len_a=0,
                                      max_len_b=max_new_tokens - 1, min_len=max(min_new_tokens - 1, 0))
        sample = {"net_input": {"src_tokens": input_ids, "src_lengths": not_pad.sum(dim=1)}}
        best = [hypotheses[0]["tokens"] for hypotheses in generator.generate([self.model], sample)]
        return data_utils.collate_tokens(best, pad)


# --- checkpoints -------------------------------------------------------------------------------------


def _read_state(path: Path, trust_checkpoint: bool) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such checkpoint file")
    if not trust_checkpoint:
        # Lists the pickled globals without unpickling anything.
        try:
            unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        except (RuntimeError, ValueError, EOFError) as error:
            raise CorruptCheckpointError(
                f"{path} is not a readable PyTorch checkpoint (truncated or corrupt; or written by torch < 1.6, "
                f"which only trust_checkpoint=True reads): {error}") from error
        if unsafe:
            raise UntrustedCheckpointError(
                f"{path} holds pickled Python objects ({', '.join(sorted(unsafe))}), and loading it runs code from "
                f"the file; every fairseq checkpoint does (its config holds an argparse.Namespace). Pass "
                f"trust_checkpoint=True only if the file comes from a source you trust.")
    try:
        state = torch.load(path, map_location="cpu", weights_only=not trust_checkpoint)
    except Exception as error:
        raise CorruptCheckpointError(f"{path}: cannot read the checkpoint (truncated or corrupt?): {error}") from error
    if not isinstance(state, dict) or "model" not in state or (state.get("cfg") is None and state.get("args") is None):
        raise CorruptCheckpointError(f"{path} is not a fairseq checkpoint: it needs 'model' and 'cfg' (or 'args')")
    return state


def _upgraded(state: dict, overrides: Mapping[str, str]) -> dict:
    """What fairseq's `load_checkpoint_to_cpu` does after `torch.load`, which it calls in a way torch >= 2.6
    refuses for fairseq checkpoints: apply `overrides`, make `cfg` an OmegaConf config, and upgrade old
    checkpoints (pre-hydra ones with `args`, such as the published WMT models) to the current format."""
    if state.get("args") is not None:
        for name, value in overrides.items():
            setattr(state["args"], name, value)
    if state.get("cfg") is not None:
        state["cfg"] = OmegaConf.create(state["cfg"], flags={"allow_objects": True})
        overwrite_args_by_name(state["cfg"], dict(overrides))
    return checkpoint_utils._upgrade_state_dict(state)


def load_checkpoint(path: str | Path, data_bin: str | Path | None = None,
                    trust_checkpoint: bool = False) -> FairseqSeq2Seq:
    """Load a fairseq translation checkpoint, pruned (by `save_checkpoint`) or not, in eval mode.

    `data_bin` is the fairseq-preprocess folder holding the dictionaries (default: the one the checkpoint
    was trained on, which must still exist). `trust_checkpoint=True` lets torch unpickle the Python objects
    that fairseq checkpoints hold, which can run code from the file: only for files you trust. Otherwise
    an `UntrustedCheckpointError` says so; an unreadable file raises `CorruptCheckpointError`.
    """
    path = Path(path)
    overrides = {"data": str(data_bin)} if data_bin is not None else {}
    state = _upgraded(_read_state(path, trust_checkpoint), overrides)
    cfg = state["cfg"]
    task = tasks.setup_task(cfg.task, from_checkpoint=True)
    if "task_state" in state:
        task.load_state_dict(state["task_state"])
    with open_dict(cfg.task):
        # Inferred from the data folder's file names when training left them unset: record them, so that the
        # split files can be named and a saved checkpoint needs no inference.
        cfg.task.source_lang, cfg.task.target_lang = task.cfg.source_lang, task.cfg.target_lang
    model = FairseqSeq2Seq(task.build_model(cfg.model, from_checkpoint=True), cfg,
                           task.source_dictionary, task.target_dictionary)
    if PRUNING_KEY in state:
        apply_pruning_record(model, state[PRUNING_KEY], path)
        check_pruned_shapes(model, state["model"], path, root=model.model,
                            error=CorruptCheckpointError)
    model.model.load_state_dict(state["model"], strict=True, model_cfg=cfg.model)
    return model.eval()


def save_checkpoint(model: FairseqSeq2Seq, path: str | Path) -> Path:
    """Write `model` (pruned or not) as a fairseq checkpoint file, atomically, with the heads each attention
    site and the neurons each FFN kept under 'head_pruning'. Reload it with `load_checkpoint(path,
    trust_checkpoint=True)` (it holds the model's fairseq config, pickled like any fairseq checkpoint's).
    Optimiser state is not kept."""
    state = {
        "args": None,
        "cfg": OmegaConf.to_container(model.cfg, resolve=True, enum_to_str=True),
        "model": model.model.state_dict(),
        # The entries fairseq's loader expects of a checkpoint; a pruned model's training starts afresh.
        "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "none",
                               "lr_scheduler_state": {}, "num_updates": 0}],
        "extra_state": {"train_iterator": None},
        PRUNING_KEY: pruning_record(model),
    }
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return write_bytes(path, buffer.getvalue())


# --- data --------------------------------------------------------------------------------------------


def read_split(model: FairseqSeq2Seq, split: str, data_bin: str | Path | None = None
               ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(source, target) token tensors of a binarised split (`train`, `valid`, `test`) of a fairseq-preprocess
    folder (default: the checkpoint's), in file order; both end in </s>."""
    task_cfg = copy.deepcopy(model.cfg.task)
    if data_bin is not None:
        with open_dict(task_cfg):
            task_cfg.data = str(data_bin)
    task = tasks.setup_task(task_cfg, from_checkpoint=True)
    task.load_dataset(split)
    dataset = task.dataset(split)
    return [dataset.src[i] for i in range(len(dataset))], [dataset.tgt[i] for i in range(len(dataset))]


def labelled_batches(model: FairseqSeq2Seq, sources: Sequence[torch.Tensor], targets: Sequence[torch.Tensor],
                     batch_size: int = 32) -> list[dict[str, torch.Tensor]]:
    """Batches of `input_ids`, `attention_mask` and `labels` (padded with -100) for `head_importance`, in
    order of source length so that little padding is computed."""
    order = np.argsort([-len(s) for s in sources], kind="stable")
    pad = model.config.pad_token_id
    return [
        collate_pairs([sources[i].tolist() for i in rows], [targets[i].tolist() for i in rows], pad)
        for rows in (order[start : start + batch_size] for start in range(0, len(order), batch_size))
    ]


def to_text(model: FairseqSeq2Seq, tokens: torch.Tensor, post_process: str | None = None,
            escape_unk: bool = False) -> str:
    """Target tokens as text, without </s>; `post_process` undoes subwords ("subword_nmt", "sentencepiece").
    `escape_unk` writes <unk> as <<unk>>, as fairseq-generate does for references, so that an unknown word of a
    reference never matches a hypothesis's <unk>."""
    return model.tgt_dict.string(tokens, post_process, escape_unk=escape_unk)


def save_dictionaries(model: FairseqSeq2Seq, folder: str | Path) -> None:
    """dict.<source lang>.txt and dict.<target lang>.txt into `folder`, which then serves as `data_bin` for
    `load_checkpoint` (a fairseq translation task reads only its dictionaries until it loads a split)."""
    task = model.cfg.task
    model.src_dict.save(str(Path(folder) / f"dict.{task.source_lang}.txt"))
    model.tgt_dict.save(str(Path(folder) / f"dict.{task.target_lang}.txt"))


def _pairs_of_split(model: FairseqSeq2Seq, data_bin: str | Path, split: str
                    ) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
    task = model.cfg.task
    name = f"{split}.{task.source_lang}-{task.target_lang}"
    if not any(Path(data_bin).glob(f"{name}.{task.source_lang}.*")):
        return None
    return read_split(model, split, data_bin)


def detokenizer(kind: str | None, lang: str) -> Callable[[str], str] | None:
    """What turns a tokenised sentence back into text before BLEU: None, or "moses" (sacremoses, the Moses
    detokenizer that the paper's scripts ran on fairseq's output before sacrebleu)."""
    if kind is None:
        return None
    if kind != "moses":
        raise ValueError(f"unknown detokenizer {kind!r}; allowed: moses, or None")
    from sacremoses import MosesDetokenizer

    moses = MosesDetokenizer(lang=lang)
    return lambda text: moses.detokenize(text.split())


def _read_references(path: str | Path, count: int, split: str) -> list[str]:
    if not Path(path).is_file():
        raise ValueError(f"{path}: no such reference file")
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    if len(lines) != count:
        raise ValueError(f"{path} has {len(lines)} lines but the {split} split has {count} sentence pairs; the "
                         f"references must be that split's target side, line for line")
    return lines


def translation_splits(model: FairseqSeq2Seq, data_bin: str | Path, max_train_pairs: int | None = None,
                       max_eval_pairs: int | None = None, seed: int = 0, post_process: str | None = None,
                       detokenize: Callable[[str], str] | None = None,
                       references: Mapping[str, str | Path] | None = None) -> datasets.DatasetDict:
    """The binarised splits of `data_bin` as the pipeline's translation data: train (if there), dev (fairseq's
    valid) and test, each with `input_ids` and `labels` (source and target token ids, ending in </s>) and the
    text of both sides: `post_process` and `detokenize` applied, references with <unk> escaped, as
    fairseq-generate scores them. `references` maps "dev"/"test" to a raw text file, one reference a line in
    the split's order, which replaces that split's target text (BLEU against the untokenised reference).

    Splits longer than their cap are a seeded random subset, in file order.
    """
    references = references or {}
    task = model.cfg.task
    out = {}
    # fairseq-preprocess names the dev split "valid".
    for ours, theirs in zip(SPLITS, ("train", "valid", "test"), strict=True):
        cap = max_eval_pairs if ours in EVAL_SPLITS else max_train_pairs
        pairs = _pairs_of_split(model, data_bin, theirs)
        if pairs is None:
            if ours not in EVAL_SPLITS:  # train is optional (a fairseq model is only evaluated); dev and test are not
                continue
            raise FileNotFoundError(
                f"{data_bin} has no {theirs} split ({theirs}.{task.source_lang}-{task.target_lang}.{task.source_lang}"
                f".bin/.idx and the same for {task.target_lang}): fairseq-preprocess it with --{theirs}pref")
        sources, targets = pairs
        if ours in references:
            raw = _read_references(references[ours], len(targets), theirs)
            target_text = raw.__getitem__
        else:
            def target_text(i: int, targets=targets) -> str:
                text = to_text(model, targets[i], post_process, escape_unk=True)
                return detokenize(text) if detokenize else text
        rows = np.arange(len(sources))
        if cap is not None and cap < len(rows):
            rows = np.sort(np.random.default_rng(seed).choice(len(rows), cap, replace=False))
        out[ours] = datasets.Dataset.from_dict({
            "source": [model.src_dict.string(sources[i], post_process) for i in rows],
            "target": [target_text(int(i)) for i in rows],
            "input_ids": [sources[i].tolist() for i in rows],
            "labels": [targets[i].tolist() for i in rows],
        })
    return datasets.DatasetDict(out)


def describe(model: FairseqSeq2Seq, checkpoint: str | Path) -> str:
    """One line naming the model, for task.json and the report."""
    base = model.model
    attn = base.encoder.layers[0].self_attn
    return (f"fairseq {getattr(model.cfg.model, 'arch', 'transformer')} {checkpoint} ({len(base.encoder.layers)}+"
            f"{len(base.decoder.layers)} layers, {attn.num_heads} heads, d_model {attn.embed_dim})")


# --- decoding and BLEU -------------------------------------------------------------------------------


@torch.inference_mode()
def generate(model: FairseqSeq2Seq, sources: Sequence[torch.Tensor], beam: int = 4, batch_size: int = 64,
             max_len_a: float = 1.2, max_len_b: int = 10, progress: bool = False) -> list[dict[str, torch.Tensor]]:
    """Decode `sources` with fairseq's SequenceGenerator, longest first; returns, in input order, each
    sentence's best hypothesis (fairseq's dict: `tokens` ending in </s>, `score`, `positional_scores`).

    Outputs are at most `max_len_a * source length + max_len_b` tokens (fairseq-generate's options; the
    source length is that of the batch's longest sentence).
    """
    model.eval()
    if not sources:
        return []
    generator = SequenceGenerator([model.model], model.tgt_dict, beam_size=beam, max_len_a=max_len_a,
                                  max_len_b=max_len_b)
    device = next(model.parameters()).device
    pad, eos = model.config.pad_token_id, model.config.eos_token_id
    order = np.argsort([-len(s) for s in sources], kind="stable")
    best: list[dict[str, torch.Tensor]] = [{}] * len(sources)
    for start in tqdm(range(0, len(order), batch_size), desc="generate", disable=not progress, leave=False):
        rows = order[start : start + batch_size]
        # Left-padded sources, as fairseq-generate gives them.
        src_tokens = data_utils.collate_tokens([sources[i] for i in rows], pad, eos, left_pad=True).to(device)
        sample = {"net_input": {"src_tokens": src_tokens, "src_lengths": src_tokens.ne(pad).sum(dim=1)}}
        for i, hypotheses in zip(rows, generator.generate([model.model], sample), strict=True):
            best[i] = {k: v.cpu() if torch.is_tensor(v) else v for k, v in hypotheses[0].items()}
    return best


class FairseqTranslationEval:
    """Scores a model by the corpus BLEU of its translations of one split: `TranslationEval` (decoding.py) for fairseq
    models (the `TaskEval` the ablation and pruning sweeps call, once per masked or pruned model).

    `references` are detokenised text; `post_process` turns hypotheses into the same form.
    """

    metric = BLEU

    def __init__(self, sources: Sequence[torch.Tensor], references: Sequence[str], beam: int = 1,
                 batch_size: int = 64, max_len_a: float = 1.2, max_len_b: int = 10, post_process: str | None = None,
                 detokenize: Callable[[str], str] | None = None, runtime: Runtime = CPU_FP32):
        if len(sources) != len(references):
            raise ValueError(f"{len(sources)} sources but {len(references)} references")
        self.sources, self.references = list(sources), list(references)
        self.beam, self.batch_size, self.max_len_a, self.max_len_b = beam, batch_size, max_len_a, max_len_b
        self.post_process, self.detokenize = post_process, detokenize
        self.runtime = runtime  # decodes under its autocast, also on a Dask worker

    def __len__(self) -> int:
        return len(self.sources)

    def __call__(self, model: FairseqSeq2Seq) -> tuple[float, list[str]]:
        with self.runtime.autocast():
            best = generate(model, self.sources, self.beam, self.batch_size, self.max_len_a, self.max_len_b)
        hypotheses = [to_text(model, hypothesis["tokens"], self.post_process) for hypothesis in best]
        if self.detokenize is not None:
            hypotheses = [self.detokenize(h) for h in hypotheses]
        return bleu(hypotheses, self.references)[0], hypotheses

    def pvalue(self, outputs: Sequence[str], baseline: Sequence[str], n_resamples: int, seed: int) -> float:
        return bleu_paired_pvalue(outputs, baseline, self.references, n_resamples, seed)
