"""The one writer of softdot's benchmark reports: the Markdown tables, the SVG
charts (and their PNGs), and the JSON results files of scripts/peers_report.py,
bench/python/attention_peers_report.py, attention_peers.py, bench_softdot.py
and softmax_torch2.py. Each of those decides what goes in a table or a chart;
how it is written is here, once.

Standard library only: scripts/peers_report.py runs under a bare Debian
python3 and imports this file from bench/python/.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess


# ---- Markdown ------------------------------------------------------------------
def md_row(cells) -> str:
    """One table row: `| a | b |`."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def md_table(header, rows, text_columns=1) -> str:
    """A Markdown table; the first text_columns columns left-aligned, the
    others (numbers) right-aligned."""
    align = ["---"] * text_columns + ["---:"] * (len(header) - text_columns)
    lines = [md_row(header), "|" + "|".join(align) + "|"]
    lines += [md_row(row) for row in rows]
    return "\n".join(lines)


def md_bullets(items) -> str:
    """`- item` lines."""
    return "\n".join(f"- {item}" for item in items)


# ---- SVG -----------------------------------------------------------------------
def esc(text) -> str:
    """Text for SVG (XML) character data and attribute values."""
    return (
        str(text)
        .replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace('"', "&quot;")
    )


def svg_open(width, height, font_size) -> list:
    """The first elements of a chart: the <svg> element and a white page."""
    return [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" '
            f'font-size="{font_size}">'
        ),
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]


def svg_close(elements) -> str:
    """The chart's text: the elements, </svg>, one per line."""
    return "\n".join(list(elements) + ["</svg>"]) + "\n"


def svg_series(points, color, width, dash="") -> list:
    """A data series: the polyline through points [(x, y)] in pixels, and a
    dot on each point."""
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    out = [f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="{width}"{dash}/>']
    out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>' for x, y in points]
    return out


# ---- files ---------------------------------------------------------------------
def write_text(path, text) -> str:
    """Writes text to path (its folder made if missing); returns path."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return path


def write_svg(path, svg, png=False) -> list:
    """Writes the chart, and a PNG beside it when png is true and
    rsvg-convert (Debian: librsvg2-bin) is installed; returns the paths
    written."""
    written = [write_text(path, svg)]
    converter = shutil.which("rsvg-convert")
    if png and converter:
        png_path = os.path.splitext(path)[0] + ".png"
        subprocess.run([converter, "-o", png_path, path], check=False)
        if os.path.exists(png_path):
            written.append(png_path)
    return written


def write_json(path, data) -> str:
    """A results file (indent 1, as all of them are written)."""
    return write_text(path, json.dumps(data, indent=1))
