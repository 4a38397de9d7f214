"""The translation `Task`: what every stage of its pipeline uses (pipeline/run/task.py)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from contextlib import nullcontext
from pathlib import Path

import datasets
import pandas as pd
import torch

from pipeline.core.importance import HeadChoice
from pipeline.data.evaluation import TaskEval
from pipeline.files.artifacts import MissingArtifact, reading
from pipeline.files.atomic import staged_dir
from pipeline.files.schema import FAIRSEQ_CHECKPOINT, RANK_CORRELATION_TABLE, SCRATCH, TABLE_COLUMNS, TRANSLATION
from pipeline.methods.pruning import CurveEvaluator, checkpoint_curves, kind_curves
from pipeline.run.experiment import log
from pipeline.run.task import Batch, Task
from pipeline.tasks.translation.decoding import TranslationEval
from pipeline.tasks.translation.marian import collate_pairs


class TranslationTask(Task):
    name = TRANSLATION
    sweep_splits = ("test",)  # decoding is the cost
    first_token_last_layer = False

    @property
    def is_fairseq(self) -> bool:
        return self.exp.params.model.backend == "fairseq"

    @property
    def trains_from_scratch(self) -> bool:
        """A Marian model that the finetune stage trains; a pretrained one or a fairseq checkpoint is evaluated."""
        return not self.is_fairseq and self.exp.params.model.name_or_path == SCRATCH

    # --- models: a Hugging Face folder, or a fairseq checkpoint with its dictionaries ------------------------
    def load(self, path: Path) -> torch.nn.Module:
        if not self.is_fairseq:
            return super().load(path)
        if not path.is_dir():
            raise MissingArtifact(path)
        return self._fairseq_checkpoint(path / FAIRSEQ_CHECKPOINT, data_bin=path).to(self.exp.runtime.device)

    def save(self, model: torch.nn.Module, path: Path) -> Path:
        if not self.is_fairseq:
            return super().save(model, path)
        from pipeline.tasks.translation import fairseq as fb

        with staged_dir(path) as staging:
            fb.save_checkpoint(model, staging / FAIRSEQ_CHECKPOINT)
            fb.save_dictionaries(model, staging)
        return path

    def _fairseq_checkpoint(self, checkpoint: Path, data_bin: Path) -> torch.nn.Module:
        from pipeline.tasks.translation import fairseq as fb

        exp = self.exp
        # Under artifacts/, the file is a stage's output: an unreadable one is damaged, and rerunning the stage
        # mends it (model.checkpoint, the user's own file, is not).
        written = checkpoint.is_relative_to(exp.artifacts)
        try:
            with reading(checkpoint, fb.CorruptCheckpointError) if written else nullcontext():
                return fb.load_checkpoint(checkpoint, data_bin, trust_checkpoint=exp.params.model.trust_checkpoint)
        except fb.UntrustedCheckpointError as error:
            raise SystemExit(f"error: model.trust_checkpoint: {error} In {exp.params_file}, set "
                             f"model.trust_checkpoint: true only if you trust {exp.params.model.checkpoint} "
                             f"(it then also covers the checkpoints this pipeline writes from it)") from None
        except fb.CheckpointError as error:
            raise SystemExit(f"error: model.checkpoint: {error}") from None

    def source_model(self) -> torch.nn.Module:
        """The fairseq checkpoint that `model.checkpoint` names, with the dictionaries of `model.data_bin`."""
        m = self.exp.params.model
        return self._fairseq_checkpoint(Path(m.checkpoint), Path(m.data_bin))

    @property
    def pad_token_id(self) -> int:
        if self.is_fairseq:
            return self.exp.task_info()["pad_token_id"]  # of the model's dictionaries, recorded by prepare
        return super().pad_token_id

    # --- data and evaluation -------------------------------------------------------------------------
    def batches(self, data: datasets.Dataset, batch_size: int) -> list[Batch]:
        pad = self.pad_token_id
        ids, labels = data["input_ids"][:], data["labels"][:]
        return [collate_pairs(ids[i : i + batch_size], labels[i : i + batch_size], pad)
                for i in range(0, len(ids), batch_size)]

    def evaluation(self, split: str, max_examples: int | None = None, num_beams: int | None = None) -> TaskEval:
        """BLEU of `split` (a seeded subset of `max_examples` pairs), decoded with `num_beams` (default:
        translate.sweep_num_beams, greedy, as the ablation and pruning sweeps use)."""
        exp = self.exp
        t = exp.params.translate
        data = exp.split(split)
        if max_examples is not None and max_examples < len(data):
            data = data.shuffle(seed=exp.params.seed).select(range(max_examples))
        if self.is_fairseq:
            from pipeline.tasks.translation import fairseq as fb

            # fairseq-generate's output length: at most max_len_a * source length + max_len_b tokens.
            m = exp.params.model
            return fb.FairseqTranslationEval([torch.tensor(ids) for ids in data["input_ids"][:]], data["target"][:],
                                             num_beams or t.sweep_num_beams, t.batch_size, max_len_a=0,
                                             max_len_b=t.max_new_tokens, post_process=m.post_process,
                                             detokenize=fb.detokenizer(m.detokenize, exp.task_info()["target_lang"]),
                                             runtime=exp.runtime)
        return TranslationEval(exp.tokenizer(), data["source"][:], data["target"][:],
                               num_beams or t.sweep_num_beams, t.batch_size, t.max_new_tokens, exp.runtime)

    def probe_batch(self, evals: Mapping[str, TaskEval]) -> Batch:
        return {k: v[:8] for k, v in self.score_batches()[0].items()}

    # --- the prune stage's figures 5 and 6 ---------------------------------------------------------------
    def extra_curves(self, evaluator: CurveEvaluator, order: list, levels: list[float], counts: list[int],
                     importance: list, choice: HeadChoice, lap) -> tuple[list[pd.DataFrame], dict[str, pd.DataFrame]]:
        exp = self.exp
        p, pp = exp.params, exp.params.prune
        curves, correlation = [], {}
        if pp.by_kind:
            curves += kind_curves(evaluator, order, levels, choice)
            lap("curves by attention kind")
        if pp.checkpoints:
            loaders = {step: functools.partial(self.load, path) for step, path in exp.checkpoint_dirs().items()}
            by_step, correlation = checkpoint_curves(
                loaders, evaluator, self.score_batches(), counts, importance, p.score.normalize_p, choice,
                log=lambda line: log.info("prune: %s", line))
            curves += by_step
            lap("checkpoint curves")
        # Figure 6's rank correlations, one row per checkpoint (no rows without prune.checkpoints).
        rows = [{"step": int(step), "spearman": rho} for step, rho in correlation.items()]
        return curves, {RANK_CORRELATION_TABLE: pd.DataFrame(rows, columns=TABLE_COLUMNS[RANK_CORRELATION_TABLE])}


TASK = TranslationTask
