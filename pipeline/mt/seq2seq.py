"""Translation models trained from scratch: a small Marian transformer, its training loop, decoding, BLEU.

Michel et al. (2019) prune a WMT14 transformer; offline we cannot download one, so the MT experiments
train their own (Vaswani et al. 2017 recipe, scaled down): shared source/target embeddings, Adam with
betas (0.9, 0.98), warm-up then inverse-square-root decay, label smoothing 0.1, batches by token budget.
Marian is used because the attention-site table (pipeline/core/sites.py) already knows its layout.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Literal

import datasets
import numpy as np
import torch
import torch.nn.functional as F
from sacrebleu.metrics import BLEU
from torch import nn
from tqdm.auto import tqdm
from transformers import GenerationConfig, MarianConfig, MarianMTModel, PreTrainedTokenizerBase

from pipeline.core.importance import LABEL_PAD

# --- model -------------------------------------------------------------------------------------------


def marian_config(
    tokenizer: PreTrainedTokenizerBase,
    d_model: int = 256,
    layers: tuple[int, int] = (3, 3),
    heads: int = 8,
    ffn_dim: int = 1024,
    max_positions: int = 256,
    dropout: float = 0.1,
) -> MarianConfig:
    """A Marian config sized for `tokenizer`'s vocabulary; `layers` is (encoder, decoder).

    As in Marian: the decoder starts from the pad token, sentences end in </s>, there is no BOS, and
    the input embeddings, output embeddings and LM head are one shared matrix. Positions are
    sinusoidal, so `max_positions` only sizes the table. Embeddings are scaled by sqrt(d_model)
    (Vaswani et al.), which the opus-mt checkpoints also do.
    """
    if d_model % heads:
        raise ValueError(f"d_model ({d_model}) must be divisible by heads ({heads})")
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    if pad is None or eos is None:
        raise ValueError("the tokenizer needs a pad and an eos token")
    enc_layers, dec_layers = layers
    return MarianConfig(
        vocab_size=len(tokenizer),
        d_model=d_model,
        encoder_layers=enc_layers,
        decoder_layers=dec_layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=ffn_dim,
        decoder_ffn_dim=ffn_dim,
        max_position_embeddings=max_positions,
        dropout=dropout,
        attention_dropout=dropout,
        activation_dropout=0.0,
        activation_function="relu",
        scale_embedding=True,
        pad_token_id=pad,
        eos_token_id=eos,
        decoder_start_token_id=pad,
        bos_token_id=None,
        forced_eos_token_id=None,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
    )


def new_marian(config: MarianConfig, seed: int = 0) -> MarianMTModel:
    """A freshly initialised model (seeded), with generation defaults fit for a small model.

    Beam 4 as in Vaswani et al.; pad is suppressed in the output because it doubles as the decoder start
    token, which the model should never generate again. The model is returned in eval mode.
    """
    torch.manual_seed(seed)
    model = MarianMTModel._from_config(config, attn_implementation="sdpa")
    # Embeddings are multiplied by sqrt(d_model); initialised at HF's std 0.02 they come out ~0.2 against
    # sinusoidal positions of ~1, and training crawls (BLEU 0.1 after 300 steps here). std d_model^-0.5,
    # as in Vaswani et al. and fairseq, makes the scaled embeddings ~1.
    shared = model.get_input_embeddings().weight
    with torch.no_grad():
        nn.init.normal_(shared, mean=0.0, std=config.d_model**-0.5)
        shared[config.pad_token_id].zero_()
    model.generation_config = GenerationConfig(
        decoder_start_token_id=config.decoder_start_token_id,
        pad_token_id=config.pad_token_id,
        eos_token_id=config.eos_token_id,
        bos_token_id=None,
        forced_eos_token_id=None,
        suppress_tokens=[config.pad_token_id],
        num_beams=4,
        max_new_tokens=config.max_position_embeddings - 1,  # sinusoidal positions: the table's size
    )
    return model.eval()


# --- training ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TranslationTrainConfig:
    steps: int
    max_tokens: int = 4096  # per batch: rows x longest source or target, padding included
    learning_rate: float = 1e-3  # the peak, reached at the end of warm-up
    warmup_steps: int = 400
    schedule: Literal["inverse_sqrt", "linear"] = "inverse_sqrt"
    label_smoothing: float = 0.1
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.98)
    max_grad_norm: float = 1.0
    seed: int = 0


def _lr_factor(cfg: TranslationTrainConfig) -> Callable[[int], float]:
    """Multiplier of the peak learning rate at scheduler step `s` (0-based): linear warm-up, then
    1/sqrt decay (Vaswani et al.; it never reaches 0, so training can be extended) or linear decay to 0
    at cfg.steps (better for a fixed, short budget)."""
    warmup = max(1, cfg.warmup_steps)

    def factor(s: int) -> float:
        step = s + 1
        if step <= warmup:
            return step / warmup
        if cfg.schedule == "inverse_sqrt":
            return math.sqrt(warmup / step)
        return max(0.0, (cfg.steps - step) / max(1, cfg.steps - warmup))

    if cfg.schedule not in ("inverse_sqrt", "linear"):
        raise ValueError(f"unknown schedule {cfg.schedule!r}; allowed: inverse_sqrt, linear")
    return factor


def token_budget_batches(
    src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, generator: np.random.Generator
) -> list[np.ndarray]:
    """One epoch of batches (row indices), each costing at most `max_tokens` = rows x longest side.

    Rows are sorted by length with a random tie-break, so batches hold similar lengths and waste little
    padding; the batch order is then shuffled. Both draws come from `generator`, so a seeded generator
    gives the same epochs. A single row longer than the budget is a batch of its own.
    """
    cost = np.maximum(src_lens, tgt_lens)
    order = np.lexsort((generator.permutation(len(cost)), cost))
    batches, start, longest = [], 0, 0
    for i, row in enumerate(order):
        longest = max(longest, int(cost[row]))
        if i > start and longest * (i - start + 1) > max_tokens:  # row i does not fit: close the batch
            batches.append(order[start:i])
            start, longest = i, int(cost[row])
    batches.append(order[start:])
    return [batches[i] for i in generator.permutation(len(batches))]


def collate_pairs(
    input_ids: Sequence[Sequence[int]], labels: Sequence[Sequence[int]], pad_id: int
) -> dict[str, torch.Tensor]:
    """Right-pad a batch: input_ids with pad (attention_mask 0 there), labels with -100 (never scored)."""
    n, src_len, tgt_len = len(input_ids), max(map(len, input_ids)), max(map(len, labels))
    ids = torch.full((n, src_len), pad_id, dtype=torch.long)
    mask = torch.zeros((n, src_len), dtype=torch.long)
    out = torch.full((n, tgt_len), LABEL_PAD, dtype=torch.long)
    for i, (x, y) in enumerate(zip(input_ids, labels, strict=True)):
        ids[i, : len(x)] = torch.tensor(x)
        mask[i, : len(x)] = 1
        out[i, : len(y)] = torch.tensor(y)
    return {"input_ids": ids, "attention_mask": mask, "labels": out}


def decoder_inputs(labels: torch.Tensor, start_id: int, pad_id: int) -> torch.Tensor:
    """Teacher forcing: the target shifted right behind the start token, label padding turned into pad."""
    shifted = torch.full_like(labels, pad_id)
    shifted[:, 0] = start_id
    shifted[:, 1:] = labels[:, :-1]
    return shifted.masked_fill(shifted == LABEL_PAD, pad_id)


def _decays(name: str, param: nn.Parameter) -> bool:
    # Weight decay on matrices only: not on biases, LayerNorm weights or the final logits bias.
    return param.dim() > 1 and "layer_norm" not in name


def train_translation(
    model: MarianMTModel,
    train_dataset: datasets.Dataset,
    tokenizer: PreTrainedTokenizerBase,
    cfg: TranslationTrainConfig,
    checkpoint_steps: Collection[int] = (),
    on_checkpoint: Callable[[int, MarianMTModel], None] | None = None,
    progress: bool = True,
) -> list[float]:
    """Train `model` in place for cfg.steps optimisation steps; returns every step's training loss.

    `train_dataset` holds input_ids and labels (tokenize_pairs). The loss is the label-smoothed
    cross-entropy averaged over the batch's target tokens (so longer sentences weigh more, as in
    fairseq and Marian). `on_checkpoint(step, model)` is called after each step in `checkpoint_steps`
    (step 0: before training), with the model in eval mode; it must not change the model. The same
    model, data, config and seed give the same losses (single-threaded CPU, or deterministic kernels).
    """
    if cfg.steps < 1:
        raise ValueError(f"steps must be positive; got {cfg.steps}")
    missing = {"input_ids", "labels"} - set(train_dataset.column_names)
    if missing or len(train_dataset) == 0:
        raise ValueError(f"train_dataset needs rows with tokenized columns input_ids, labels (see tokenize_pairs); "
                         f"got {len(train_dataset)} rows with columns {train_dataset.column_names}")
    bad = sorted(s for s in checkpoint_steps if not 0 <= s <= cfg.steps)
    if bad:
        raise ValueError(f"checkpoint steps {bad} lie outside 0..{cfg.steps}")
    if checkpoint_steps and on_checkpoint is None:
        raise ValueError("checkpoint_steps given without on_checkpoint")
    pad_id = tokenizer.pad_token_id
    start_id = model.config.decoder_start_token_id
    # Plain lists: indexing a datasets Column row by row costs ~0.1 ms a row.
    src, tgt = train_dataset["input_ids"][:], train_dataset["labels"][:]
    src_lens, tgt_lens = np.array([len(x) for x in src]), np.array([len(y) for y in tgt])
    longest = int(max(src_lens.max(), tgt_lens.max()))
    if longest > model.config.max_position_embeddings:
        raise ValueError(
            f"a training sentence has {longest} tokens but the model has only "
            f"{model.config.max_position_embeddings} positions; tokenize with max_length <= that"
        )

    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for n, p in params if _decays(n, p)], "weight_decay": cfg.weight_decay},
            {"params": [p for n, p in params if not _decays(n, p)], "weight_decay": 0.0},
        ],
        lr=cfg.learning_rate,
        betas=cfg.betas,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_factor(cfg))
    generator = np.random.default_rng(cfg.seed)
    torch.manual_seed(cfg.seed)  # dropout masks
    device = next(model.parameters()).device

    def checkpoint(step: int) -> None:
        if step in checkpoint_steps:
            model.eval()
            on_checkpoint(step, model)
            model.train()

    model.train()
    checkpoint(0)
    losses: list[float] = []
    with tqdm(total=cfg.steps, desc="train", disable=not progress) as bar:
        while len(losses) < cfg.steps:
            for rows in token_budget_batches(src_lens, tgt_lens, cfg.max_tokens, generator):
                batch = collate_pairs([src[i] for i in rows], [tgt[i] for i in rows], pad_id)
                batch = {k: v.to(device) for k, v in batch.items()}
                labels = batch.pop("labels")
                logits = model(**batch, decoder_input_ids=decoder_inputs(labels, start_id, pad_id)).logits
                loss = F.cross_entropy(
                    logits.float().flatten(0, 1),
                    labels.flatten(),
                    ignore_index=LABEL_PAD,
                    label_smoothing=cfg.label_smoothing,
                )
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                losses.append(loss.item())
                bar.update()
                bar.set_postfix(loss=f"{losses[-1]:.3f}", lr=f"{scheduler.get_last_lr()[0]:.2e}")
                checkpoint(len(losses))
                if len(losses) == cfg.steps:
                    break
    model.eval()
    return losses


# --- decoding ----------------------------------------------------------------------------------------


@torch.inference_mode()
def translate(
    model: MarianMTModel,
    tokenizer: PreTrainedTokenizerBase,
    sources: Sequence[str],
    num_beams: int = 4,
    batch_size: int = 64,
    max_new_tokens: int = 128,
    max_source_length: int | None = None,
    progress: bool = False,
) -> list[str]:
    """Translate `sources`, returning detokenised strings in the same order.

    Sentences are batched longest first, so each batch pads to similar lengths (and an out-of-memory
    batch fails at once); beam search with `num_beams` (1: greedy). Sources are truncated to
    `max_source_length` tokens (default: the model's position table). The model is left in eval mode.
    """
    model.eval()
    if not sources:
        return []
    device = next(model.parameters()).device
    max_source_length = max_source_length or model.config.max_position_embeddings
    encoded = tokenizer(list(sources), truncation=True, max_length=max_source_length)["input_ids"]
    order = np.argsort([-len(x) for x in encoded], kind="stable")
    outputs: list[str] = [""] * len(encoded)
    for start in tqdm(range(0, len(order), batch_size), desc="translate", disable=not progress, leave=False):
        rows = order[start : start + batch_size]
        batch = tokenizer.pad({"input_ids": [encoded[i] for i in rows]}, return_tensors="pt")
        generated = model.generate(
            input_ids=batch["input_ids"].to(device),
            attention_mask=batch["attention_mask"].to(device),
            num_beams=num_beams,
            do_sample=False,
            max_new_tokens=max_new_tokens,
        )
        texts = tokenizer.batch_decode(generated, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        for i, text in zip(rows, texts, strict=True):
            outputs[i] = text
    return outputs


# --- BLEU --------------------------------------------------------------------------------------------


def _check_lengths(references: Sequence[str], **hypotheses: Sequence[str]) -> None:
    if len(references) == 0:
        raise ValueError("cannot score zero sentences")
    for name, hyps in hypotheses.items():
        if len(hyps) != len(references):
            raise ValueError(f"{name} has {len(hyps)} sentences but there are {len(references)} references")


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[float, str]:
    """Corpus BLEU (sacrebleu defaults: 13a tokenisation, mixed case, exp smoothing), one reference
    per hypothesis, and sacrebleu's signature string, which the report quotes so scores are comparable."""
    _check_lengths(references, hypotheses=hypotheses)
    metric = BLEU()
    score = metric.corpus_score(list(hypotheses), [list(references)])
    return float(score.score), str(metric.get_signature())


def bleu_paired_pvalue(
    system_hyps: Sequence[str],
    baseline_hyps: Sequence[str],
    references: Sequence[str],
    n_resamples: int = 1000,
    seed: int = 0,
) -> float:
    """One-sided paired bootstrap p-value that the system's observed BLEU advantage over the baseline
    (or disadvantage) is due to chance; the convention of metrics.paired_bootstrap_pvalue.

    Koehn (2004): resample n of the n sentences with replacement, the same draw for both systems, and
    compute delta* = BLEU(system) - BLEU(baseline) on each resample; p is the fraction of resamples whose
    delta* does not have the sign of the observed delta (ties count against it); p = 1 if delta == 0.
    sacrebleu's own PairedTest is two-sided (it tests |delta| against a re-centred distribution) and
    takes its seed from an environment variable, so it is not used; its per-sentence sufficient
    statistics are, so BLEU on a resample is a sum plus sacrebleu's own formula and agrees exactly with
    corpus_score.
    """
    _check_lengths(references, system_hyps=system_hyps, baseline_hyps=baseline_hyps)
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be positive; got {n_resamples}")
    metric = BLEU()
    refs = [list(references)]
    stats_sys = np.asarray(metric._extract_corpus_statistics(list(system_hyps), refs), dtype=np.int64)
    stats_base = np.asarray(metric._extract_corpus_statistics(list(baseline_hyps), refs), dtype=np.int64)

    def score(summed: np.ndarray) -> float:
        return metric._compute_score_from_stats([int(v) for v in summed]).score

    observed = score(stats_sys.sum(0)) - score(stats_base.sum(0))
    if observed == 0:
        return 1.0
    n = len(references)
    rng = np.random.default_rng(seed)
    deltas = np.empty(n_resamples)
    chunk = max(1, 2_000_000 // n)  # resamples per block: bounds memory at ~16 MB of indices
    for start in range(0, n_resamples, chunk):
        b = min(chunk, n_resamples - start)
        idx = rng.integers(0, n, size=(b, n), dtype=np.int32)
        # counts[r, i] = how often sentence i was drawn in resample r; summed stats = counts @ stats.
        counts = np.bincount((idx + (np.arange(b) * n)[:, None]).ravel(), minlength=b * n).reshape(b, n)
        for r, (s, t) in enumerate(zip(counts @ stats_sys, counts @ stats_base, strict=True)):
            deltas[start + r] = score(s) - score(t)
    return float(np.mean(deltas * np.sign(observed) <= 0))


class TranslationEval:
    """Scores a model by the corpus BLEU of its translations of one split (`ClassificationEval`'s twin).

    The outputs are the hypotheses, so the paired bootstrap compares two models' translations of the
    same sentences.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, sources: Sequence[str], references: Sequence[str],
                 num_beams: int = 1, batch_size: int = 64, max_new_tokens: int = 64):
        _check_lengths(references, sources=sources)
        self.tokenizer, self.sources, self.references = tokenizer, list(sources), list(references)
        self.num_beams, self.batch_size, self.max_new_tokens = num_beams, batch_size, max_new_tokens

    def __len__(self) -> int:
        return len(self.sources)

    def __call__(self, model: MarianMTModel) -> tuple[float, list[str]]:
        hypotheses = translate(model, self.tokenizer, self.sources, self.num_beams, self.batch_size,
                               self.max_new_tokens)
        return bleu(hypotheses, self.references)[0], hypotheses

    def pvalue(self, outputs: Sequence[str], baseline: Sequence[str], n_resamples: int, seed: int) -> float:
        return bleu_paired_pvalue(outputs, baseline, self.references, n_resamples, seed)
