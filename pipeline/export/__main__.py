"""`python -m pipeline.export gguf <saved folder> <file.gguf> [--type f32|f16|q8_0]`: a saved model (a pruned folder
of the prune stage, or any Hugging Face folder of an exported family) as one GGUF file, which llama.cpp runs and
transformers reads (`from_pretrained(folder, gguf_file=name)`). Bad input is refused in one line, nothing written."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from pipeline.export.gguf import OUTPUT_TYPES, ExportError, export_gguf


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipeline.export",
                                     description="Export a saved model to another format.")
    formats = parser.add_subparsers(dest="format", required=True)
    gguf = formats.add_parser("gguf", help="llama.cpp's GGUF file")
    gguf.add_argument("folder", type=Path, help="the saved model folder (config.json, weights, tokenizer)")
    gguf.add_argument("dest", type=Path, help="the .gguf file to write")
    gguf.add_argument("--type", default="f16", choices=list(OUTPUT_TYPES),
                      help="the weights' type: f32, f16 (default), or q8_0 (8-bit blocks of 32)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)
    start = time.perf_counter()
    try:
        dest = export_gguf(args.folder, args.dest, args.type)
    except ExportError as error:
        raise SystemExit(f"error: {error}") from None
    print(f"wrote {dest} ({dest.stat().st_size / 2**20:,.1f} MiB, {args.type}) in "
          f"{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
