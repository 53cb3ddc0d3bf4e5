"""A simulation study as one self-contained HTML page (``pollux simulate --html``): the
tables the CLI prints and every figure of ``--plot``, embedded as data URIs, so the page
can be mailed or archived as a single file that needs no network."""

from __future__ import annotations

import base64
import html
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pollux import __version__
from pollux.sim.metrics import RunRecord
from pollux.sim.runner import Timeline


@dataclass(frozen=True)
class TextTable:
    """A table of formatted cells: what the CLI prints and the report shows."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px auto;
  max-width: 1100px; color: #1d2330; padding: 0 16px; }
h1 { font-size: 22px; } h2 { font-size: 16px; margin-top: 28px; }
p.meta { color: #6b7280; }
table { border-collapse: collapse; margin: 8px 0 16px; }
th, td { padding: 4px 12px; border-bottom: 1px solid #e3e6eb; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { color: #6b7280; font-weight: 600; font-size: 13px; }
figure { margin: 12px 0 24px; } figcaption { color: #6b7280; font-size: 13px; }
img { max-width: 100%; border: 1px solid #e3e6eb; }
"""


def table_html(table: TextTable) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
                   for row in table.rows)
    return (f"<h2>{html.escape(table.title)}</h2>\n<table><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>")


def figure_html(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    caption = html.escape(path.stem.replace("_", " ").replace("-", " · ", 1))
    return (f'<figure><img alt="{caption}" src="data:image/png;base64,{data}">'
            f"<figcaption>{caption}</figcaption></figure>")


def render_report(title: str, description: str, tables: Sequence[TextTable],
                  figures: Sequence[Path]) -> str:
    """The page's HTML: tables first, then the figures (each embedded)."""
    made = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [f"<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
             f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>",
             f'<p class="meta">{html.escape(description)}<br>pollux {__version__}, {made}</p>',
             *(table_html(t) for t in tables)]
    if figures:
        parts.append("<h2>Figures</h2>")
        parts.extend(figure_html(path) for path in figures)
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_report(path: str | Path, title: str, description: str,
                 tables: Sequence[TextTable], records: Sequence[RunRecord],
                 timelines: Sequence[Timeline | None]) -> Path:
    """Write the report of these runs (``timelines[i]`` belongs to ``records[i]``)."""
    from pollux.sim.plots import save_plots

    out = Path(path)
    with tempfile.TemporaryDirectory(prefix="pollux-report-") as scratch:
        figures = save_plots(records, timelines, scratch)
        page = render_report(title, description, tables, figures)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out
