"""One experiment's files and the loaders every stage shares.

Layout (DVC outputs):
    artifacts/<experiment>/base_model/   the model to fine-tune, with its tokenizer (prepare)
    artifacts/<experiment>/data/         tokenised train/dev/test splits + task.json (prepare)
    artifacts/<experiment>/finetuned/    the fine-tuned model (finetune)
    artifacts/<experiment>/pruned/<pct>/ physically pruned models (prune)
    reports/<experiment>/                CSV tables, metrics JSON, figures and the report
Only `prepare` reads the hub or the pinned wheels; every later stage reads these folders.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import datasets
import torch
import transformers
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from pipeline.checkpoint import load_model
from pipeline.config import Params, ParamsError, load_params
from pipeline.evaluation import EvalSet, labelled_batches, make_eval_set

log = logging.getLogger("pipeline")

WHEEL_CACHE = Path(".cache") / "wheels"


@dataclass(frozen=True)
class Experiment:
    params: Params

    @classmethod
    def from_params_file(cls, path: str | Path = "params.yaml") -> Experiment:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
        # Hugging Face's own info/warning chatter (e.g. "newly initialised classifier") buries our one
        # line per stage; errors still show.
        transformers.logging.set_verbosity_error()
        datasets.disable_progress_bars()
        try:
            return cls(load_params(path))
        except ParamsError as error:
            raise SystemExit(f"error: {error}") from None

    # --- paths -------------------------------------------------------------------------------------
    @property
    def artifacts(self) -> Path:
        return self.params.artifact_dir

    @property
    def reports(self) -> Path:
        return self.params.report_dir

    @property
    def base_model_dir(self) -> Path:
        return self.artifacts / "base_model"

    @property
    def data_dir(self) -> Path:
        return self.artifacts / "data"

    @property
    def finetuned_dir(self) -> Path:
        return self.artifacts / "finetuned"

    @property
    def pruned_root(self) -> Path:
        return self.artifacts / "pruned"

    def pruned_dir(self, fraction: float) -> Path:
        return self.pruned_root / f"{round(100 * fraction):02d}"

    # --- loaders -----------------------------------------------------------------------------------
    def task(self) -> dict:
        return json.loads((self.data_dir / "task.json").read_text())

    def splits(self) -> datasets.DatasetDict:
        # In memory: shuffles and selections must never write cache files into a DVC-tracked output.
        return datasets.load_from_disk(str(self.data_dir), keep_in_memory=True)

    def tokenizer(self):
        return AutoTokenizer.from_pretrained(self.base_model_dir)

    def base_classifier(self) -> torch.nn.Module:
        torch.manual_seed(self.params.seed)  # the fresh classification head's initialisation
        return AutoModelForSequenceClassification.from_pretrained(
            self.base_model_dir, num_labels=self.task()["num_labels"],
            attn_implementation=self.params.model.attn_implementation)

    def load(self, path: Path) -> torch.nn.Module:
        return load_model(path, attn_implementation=self.params.model.attn_implementation)

    def eval_sets(self, splits: tuple[str, ...] = ("dev", "test"), max_examples: int | None = None
                  ) -> dict[str, EvalSet]:
        """Evaluation batches of each split; a seeded random subset of `max_examples` when given (the
        sweeps of ablate and prune evaluate hundreds of models, and their cost is linear in it)."""
        data, tokenizer = self.splits(), self.tokenizer()
        sets = {}
        for split in splits:
            dataset = data[split]
            if max_examples is not None and max_examples < len(dataset):
                dataset = dataset.shuffle(seed=self.params.seed).select(range(max_examples))
            sets[split] = make_eval_set(dataset, tokenizer, self.params.eval.batch_size)
        return sets

    def score_batches(self) -> list[dict[str, torch.Tensor]]:
        """The importance-scoring data: a seeded subset of `score.split` (the paper used training data)."""
        s = self.params.score
        data = self.splits()[s.split]
        if s.max_examples is not None and s.max_examples < len(data):
            data = data.shuffle(seed=self.params.seed).select(range(s.max_examples))
        return labelled_batches(data, self.tokenizer(), s.batch_size)
