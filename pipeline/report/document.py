"""The report as a document: a list of blocks rendered twice, to Markdown and to HTML, so both say the same.

The HTML is self-contained (inline CSS, figures as data: URLs), so it works offline and can be mailed or
archived as one file. Numbers reach the document as display strings, formatted by the helpers at the end.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field

import pandas as pd


@dataclass
class Figure:
    name: str  # file name under figures/
    png: bytes
    caption: str


@dataclass
class Doc:
    blocks: list[tuple] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)

    def h(self, level: int, text: str) -> None:
        self.blocks.append(("h", level, text))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def ul(self, items: list[str]) -> None:
        if items:
            self.blocks.append(("ul", items))

    def table(self, df: pd.DataFrame) -> None:
        """df holds display strings already (formatting is the caller's job)."""
        self.blocks.append(("table", df))

    def figure(self, name: str, png: bytes, caption: str) -> None:
        item = Figure(name, png, caption[:1].upper() + caption[1:])
        self.figures.append(item)
        self.blocks.append(("fig", item))


def _md_cell(x: object) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def to_markdown(doc: Doc, title: str) -> str:
    out = [f"# {title}", ""]
    for block in doc.blocks:
        kind = block[0]
        if kind == "h":
            out += ["#" * (block[1] + 1) + " " + block[2], ""]
        elif kind == "p":
            out += [block[1], ""]
        elif kind == "ul":
            out += [f"- {item}" for item in block[1]] + [""]
        elif kind == "table":
            df = block[1]
            out.append("| " + " | ".join(_md_cell(c) for c in df.columns) + " |")
            out.append("|" + "|".join(" --- " for _ in df.columns) + "|")
            out += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
            out.append("")
        elif kind == "fig":
            out += [f"![{block[1].caption}](figures/{block[1].name})", "", f"*{block[1].caption}*", ""]
    return "\n".join(out)


CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; max-width: 1100px;
       margin: 2em auto; padding: 0 1em; color: #222; line-height: 1.45; }
h1 { border-bottom: 2px solid #ddd; padding-bottom: .3em; }
h2 { border-bottom: 1px solid #eee; padding-bottom: .2em; margin-top: 1.8em; }
table { border-collapse: collapse; margin: .8em 0; font-size: .92em; }
th, td { border: 1px solid #ccc; padding: .25em .6em; text-align: right; }
th { background: #f3f3f3; }
td:first-child, th:first-child { text-align: left; }
figure { margin: 1em 0; }
figure img { max-width: 100%; height: auto; }
figcaption { color: #555; font-size: .9em; }
"""


def to_html(doc: Doc, title: str) -> str:
    esc = html.escape
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(title)}</title>",
        f"<style>{CSS}</style>",
        "</head><body>",
        f"<h1>{esc(title)}</h1>",
    ]
    for block in doc.blocks:
        kind = block[0]
        if kind == "h":
            level = block[1] + 1
            out.append(f"<h{level}>{esc(block[2])}</h{level}>")
        elif kind == "p":
            out.append(f"<p>{esc(block[1])}</p>")
        elif kind == "ul":
            out.append("<ul>" + "".join(f"<li>{esc(item)}</li>" for item in block[1]) + "</ul>")
        elif kind == "table":
            df = block[1]
            head = "".join(f"<th>{esc(str(c))}</th>" for c in df.columns)
            rows = "".join(
                "<tr>" + "".join(f"<td>{esc(str(v))}</td>" for v in row) + "</tr>" for row in df.itertuples(index=False)
            )
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif kind == "fig":
            # Inline the PNG so the page works offline and can be mailed or archived as one file.
            data = base64.b64encode(block[1].png).decode("ascii")
            cap = esc(block[1].caption)
            out.append(
                f'<figure><img alt="{cap}" src="data:image/png;base64,{data}"><figcaption>{cap}</figcaption></figure>'
            )
    out.append("</body></html>")
    return "\n".join(out)


# --- display strings --------------------------------------------------------------------------------


def pct(fraction: float) -> str:
    """0.3 -> '30%', 0.125 -> '12.5%'."""
    return f"{100 * fraction:.1f}".removesuffix(".0") + "%"


def num(x: float, digits: int = 1) -> str:
    return f"{x:.{digits}f}"


def signed(x: float, digits: int = 1) -> str:
    return f"{x:+.{digits}f}"


# What the brackets of `with_spread` hold, for the tables' headers and the prose around them.
SPREAD_HEADER = "speedup [range]"
SPREAD_IN_BRACKETS = "the range of the rounds' ratios in brackets (a confidence interval for the median)"


def with_spread(frame: pd.DataFrame, column: str = "speedup", digits: int = 2) -> pd.Series:
    """Each row's median ratio with its range over the benchmark's rounds (the confidence interval for the median
    that two runs are compared by, pipeline/core/timer.py), "1.23 [1.18, 1.29]"."""
    return pd.Series([f"{num(m, digits)} [{num(lo, digits)}, {num(hi, digits)}]" for m, lo, hi in
                      zip(frame[column], frame[f"{column}_min"], frame[f"{column}_max"], strict=True)],
                     index=frame.index)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
