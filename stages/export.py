"""Stage export (language models): every saved model that one GGUF file can hold (a uniform folder of a family
llama.cpp runs) written as GGUF in each of `export.types` (pipeline/export/gguf.py), and read back by transformers'
own GGUF loader, so the table shows each file's size beside the folder's safetensors and its test perplexity beside
the folder's, on the same windows (gguf.csv). A folder GGUF cannot express is listed with the reason, not exported.
"""

from __future__ import annotations

from pipeline.run.preflight import preflight

if __name__ == "__main__":  # the params in a second or two, before the imports below load torch
    preflight("export")

import pandas as pd
import torch
from transformers import AutoModelForCausalLM

from pipeline.export.gguf import ExportError, export_gguf
from pipeline.files.atomic import write_csv
from pipeline.files.schema import GGUF_DIR, GGUF_TABLE, TABLE_COLUMNS, UNPRUNED_MODEL
from pipeline.run.experiment import Experiment, log


def main(argv: list[str] | None = None) -> None:
    exp = Experiment.from_cli(argv)
    e = exp.params.export
    test = exp.task.evaluation("test", e.max_examples)
    out = exp.artifacts / GGUF_DIR
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for label, folder in exp.task.saved_models().items():
        if label == UNPRUNED_MODEL and not e.unpruned:
            continue
        safetensors = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
        folder_ppl = test(exp.load(folder))[0]
        for out_type in e.types:
            dest = out / f"{folder.name}.{out_type}.gguf"
            try:
                export_gguf(folder, dest, out_type)
            except ExportError as error:
                log.warning("export: %s", error)
                rows.append(dict(model=label, type=out_type, safetensors_mib=safetensors / 2**20, gguf_mib=None,
                                 perplexity_folder=folder_ppl, perplexity_gguf=None, not_exported_because=str(error)))
                break
            model = AutoModelForCausalLM.from_pretrained(out, gguf_file=dest.name, dtype=torch.float32)
            model = model.to(exp.runtime.device).eval()  # evaluated as the folder is, at the runtime's precision
            rows.append(dict(model=label, type=out_type, safetensors_mib=safetensors / 2**20,
                             gguf_mib=dest.stat().st_size / 2**20, perplexity_folder=folder_ppl,
                             perplexity_gguf=test(model)[0], not_exported_because=""))
            log.info("export: %s as %s: %.1f MiB (safetensors %.1f), test perplexity %.3f (folder %.3f)", label,
                     out_type, rows[-1]["gguf_mib"], rows[-1]["safetensors_mib"], rows[-1]["perplexity_gguf"],
                     folder_ppl)
    write_csv(exp.reports / GGUF_TABLE, exp.stamped(pd.DataFrame(rows, columns=TABLE_COLUMNS[GGUF_TABLE])))


if __name__ == "__main__":
    main()
