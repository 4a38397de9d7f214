"""Stage export (language models): every saved model that one GGUF file can hold (a uniform folder of a family
llama.cpp runs) written as GGUF in each of `export.types` (pipeline/export/gguf.py) and, from the F16 file, in each of
`export.quantized` by llama.cpp's own llama-quantize. Each file is read back twice:
- by transformers' own GGUF loader, on the test windows the folder is scored on (gguf.csv: size beside the folder's
  safetensors, perplexity beside the folder's);
- by llama.cpp itself, where it is built (`make llama-cpp`; llama_cpp.csv): llama-tokenize's ids of the test text
  beside the folder tokenizer's, llama-perplexity's estimate beside the pipeline's own on those same tokens, by
  llama-perplexity's protocol (pipeline/export/llama_cpp.py), and llama-bench's prompt and decode speed beside the
  unpruned file's of the same type and the ideals. Where llama.cpp is not built, the table says so.
The speeds are measured here rather than in the benchmark stage, which times every family's PyTorch models before
any GGUF file exists: this stage makes the files and holds llama.cpp.
A folder GGUF cannot express is listed with the reason, not exported.
"""

from __future__ import annotations

from pipeline.run.preflight import preflight

if __name__ == "__main__":  # the params in a second or two, before the imports below load torch
    preflight("export")

from pathlib import Path

import numpy as np
import pandas as pd
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline.core.flops import forward_flops
from pipeline.export import llama_cpp
from pipeline.export.gguf import ExportError, export_gguf
from pipeline.files.atomic import write_csv
from pipeline.files.schema import GGUF_DIR, GGUF_TABLE, TABLE_COLUMNS, UNPRUNED_MODEL
from pipeline.run.experiment import Experiment, log
from pipeline.tasks.language_modeling.llama_cpp_table import LLAMA_CPP_COLUMNS, LLAMA_CPP_TABLE


class LlamaCppCheck:
    """llama.cpp's reading of each file beside the pipeline's, on one text: the test split's windows, decoded."""

    def __init__(self, exp: Experiment, tools: llama_cpp.Tools | str, out: Path):
        e = exp.params.export
        self.tools, self.windows, self.tokens = tools, e.llama_cpp_windows, e.llama_cpp_window_tokens
        self.prompt_tokens, self.new_tokens, self.repeats = (e.llama_bench_prompt_tokens, e.llama_bench_new_tokens,
                                                             e.llama_bench_repeats)
        self.tokenizer = AutoTokenizer.from_pretrained(exp.finetuned_dir)
        test = exp.split("test")["input_ids"][:]
        # Without special tokens: llama-tokenize and llama-perplexity read a file's "<|im_end|>" as text.
        text = self.tokenizer.decode([i for ids in test for i in ids], skip_special_tokens=True)
        self.text_file = out / "llama_cpp_test.txt"
        self.ids = self.tokenizer.encode(llama_cpp.write_text(self.text_file, text), add_special_tokens=False)
        self.bos = self.tokenizer.bos_token_id if getattr(self.tokenizer, "add_bos_token", False) else None
        # llama-perplexity refuses a text of fewer than two windows (tools/perplexity/perplexity.cpp).
        self.too_short = (f"the test text has {len(self.ids)} tokens, fewer than the {2 * self.tokens} that "
                          f"llama-perplexity needs for windows of {self.tokens}" if len(self.ids) < 2 * self.tokens
                          else "")
        self.threads = torch.get_num_threads()

    def reference(self, model: torch.nn.Module) -> tuple[float, int]:
        """The folder's model's llama-perplexity estimate in float32, no autocast (llama.cpp's F16 and Q8_0 files
        compute in float32 from their stored weights, so this is the figure they should give), and the FLOPs of a
        llama-bench prompt, whose ratio to the unpruned model's is the ideal prompt speedup."""
        prompt = torch.zeros(1, self.prompt_tokens, dtype=torch.long)
        # The prefill's FLOPs as the benchmark stage counts them (pipeline/methods/llm_bench.py, prefill_flops).
        flops = forward_flops(model, {"input_ids": prompt, "attention_mask": torch.ones_like(prompt), "use_cache": True,
                                      "logits_to_keep": 1})
        if self.too_short:
            return float("nan"), flops
        return llama_cpp.windows_perplexity(model, self.ids, self.tokens, self.windows, self.bos), flops

    def speeds(self, files: dict[str, Path]) -> dict[str, list[tuple[float, float]]]:
        """Each file's (prompt, decode) tokens/s in every round of llama-bench, the files of one type taking turns
        within a round, so that a slow spell of the machine falls on all of them; {} without llama.cpp."""
        if isinstance(self.tools, str):
            return {}
        rounds: dict[str, list[tuple[float, float]]] = {label: [] for label in files}
        try:
            for _ in range(self.repeats):
                for label, dest in files.items():
                    rounds[label].append(self.tools.bench(dest, self.prompt_tokens, self.new_tokens, self.threads))
        except llama_cpp.LlamaCppError as error:
            log.warning("export: llama-bench: %s", error)
            return {}
        return rounds

    def row(self, label: str, out_type: str, dest: Path, reference: float) -> dict:
        row = dict(model=label, type=out_type, gguf_mib=dest.stat().st_size / 2**20, perplexity_pipeline=reference)
        if isinstance(self.tools, str):
            return {**row, "not_measured_because": self.tools}
        try:
            ids = self.tools.tokenize(dest, self.text_file)
            same = llama_cpp.first_difference(ids, self.ids)
            ppl = (float("nan") if self.too_short else
                   self.tools.perplexity(dest, self.text_file, self.tokens, self.windows, self.threads))
        except llama_cpp.LlamaCppError as error:
            log.warning("export: llama.cpp on %s: %s", dest.name, error)
            return {**row, "not_measured_because": str(error)}
        log.info("export: %s as %s in llama.cpp: perplexity %.3f (pipeline %.3f), tokens %s", label, out_type, ppl,
                 reference, "equal" if same is None else f"differ from token {same}")
        return {**row, "tokens": len(ids), "tokens_equal": same is None, "first_differing_token": same,
                "perplexity_llama_cpp": ppl, "not_measured_because": self.too_short}


def add_speeds(rows: list[dict], check: LlamaCppCheck, flops: dict[str, int]) -> None:
    """llama-bench's medians into the rows of one type's files, and beside the unpruned file's, where it was
    exported: the median over rounds of the speed ratio within a round, and the ideals (FLOPs of a prompt; bytes of
    the file, which a decoded token reads whole)."""
    rounds = check.speeds({r["model"]: r["file"] for r in rows if "tokens" in r})  # llama.cpp read the file
    base = next((r for r in rows if r["model"] == UNPRUNED_MODEL), None)
    for row in rows:
        samples = rounds.get(row["model"])
        if not samples:
            continue
        row["prompt_tokens_per_s"], row["decode_tokens_per_s"] = np.median(samples, axis=0)
        if base is not None and base["model"] in rounds:
            ratios = np.asarray(samples) / np.asarray(rounds[base["model"]])
            row["prompt_speedup"], row["decode_speedup"] = np.median(ratios, axis=0)
            row["ideal_prompt_speedup_flops"] = flops[base["model"]] / flops[row["model"]]
            row["ideal_decode_speedup_bytes"] = base["gguf_mib"] / row["gguf_mib"]
        log.info("export: %s as %s in llama-bench: prompt %.1f tokens/s, decode %.1f tokens/s", row["model"],
                 row["type"], row["prompt_tokens_per_s"], row["decode_tokens_per_s"])


def main(argv: list[str] | None = None) -> None:
    exp = Experiment.from_cli(argv)
    e = exp.params.export
    test = exp.task.evaluation("test", e.max_examples)
    out = exp.artifacts / GGUF_DIR
    out.mkdir(parents=True, exist_ok=True)
    tools = llama_cpp.find_tools()
    if isinstance(tools, str):
        log.warning("export: %s", tools)
    check = LlamaCppCheck(exp, tools, out)
    rows, served, flops = [], [], {}
    for label, folder in exp.task.saved_models().items():
        if label == UNPRUNED_MODEL and not e.unpruned:
            continue
        safetensors = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
        model = exp.load(folder)  # the family's loader: a folder pruned per layer is no stock folder
        folder_ppl = test(model)[0]
        reference, flops[label] = check.reference(model)
        files: list[tuple[str, Path]] = []
        for out_type in e.types:
            dest = out / f"{folder.name}.{out_type}.gguf"
            try:
                files.append((out_type, export_gguf(folder, dest, out_type)))
            except ExportError as error:
                log.warning("export: %s", error)
                rows.append(dict(model=label, type=out_type, safetensors_mib=safetensors / 2**20, gguf_mib=None,
                                 perplexity_folder=folder_ppl, perplexity_gguf=None, not_exported_because=str(error)))
                break
        f16 = dict(files).get("f16")
        for out_type in e.quantized if f16 is not None else []:
            if isinstance(tools, str):
                rows.append(dict(model=label, type=out_type, safetensors_mib=safetensors / 2**20, gguf_mib=None,
                                 perplexity_folder=folder_ppl, perplexity_gguf=None, not_exported_because=tools))
                continue
            dest = out / f"{folder.name}.{out_type}.gguf"
            files.append((out_type, tools.quantize(f16, dest, out_type.upper(), check.threads)))
        for out_type, dest in files:
            model = AutoModelForCausalLM.from_pretrained(out, gguf_file=dest.name, dtype=torch.float32)
            model = model.to(exp.runtime.device).eval()  # evaluated as the folder is, at the runtime's precision
            rows.append(dict(model=label, type=out_type, safetensors_mib=safetensors / 2**20,
                             gguf_mib=dest.stat().st_size / 2**20, perplexity_folder=folder_ppl,
                             perplexity_gguf=test(model)[0], not_exported_because=""))
            log.info("export: %s as %s: %.1f MiB (safetensors %.1f), test perplexity %.3f (folder %.3f)", label,
                     out_type, rows[-1]["gguf_mib"], rows[-1]["safetensors_mib"], rows[-1]["perplexity_gguf"],
                     folder_ppl)
            served.append(check.row(label, out_type, dest, reference) | {"file": dest})
    for out_type in dict.fromkeys(r["type"] for r in served):
        add_speeds([r for r in served if r["type"] == out_type], check, flops)
    write_csv(exp.reports / GGUF_TABLE, exp.stamped(pd.DataFrame(rows, columns=TABLE_COLUMNS[GGUF_TABLE])))
    write_csv(exp.reports / LLAMA_CPP_TABLE, pd.DataFrame(served, columns=LLAMA_CPP_COLUMNS))


if __name__ == "__main__":
    main()
