"""Draws docs/img/logchannel.svg from the JSON that `logchannel_bench.py --json` writes:
three panels (lines/s, driver CPU per million lines, output GB/s), a bar per median and a
dot per run. Plain SVG written by hand: matplotlib is not a dependency of this project.

    .venv/bin/python bench/logchannel_svg.py RESULTS.json docs/img/logchannel.svg
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

W, H = 320, 260  # one panel
TOP, BOTTOM, LEFT = 46, 52, 58
COLORS = {"torchspark": "#1f6fb4", "stock": "#c0504d"}


def esc(t: str) -> str:
    return t.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def panel(x0: int, title: str, unit: str, bars: list, goal: float | None = None,
          goal_label: str = "", W: int = W) -> list:  # noqa: N803 (the panel's width)
    """bars: (label, color, runs). Linear axis from 0 to the largest run (or the goal)."""
    top = max([max(r) for _, _, r in bars] + [goal or 0]) * 1.15
    plot_h = H - TOP - BOTTOM
    plot_w = W - LEFT - 16
    y = lambda v: TOP + plot_h * (1 - v / top)  # noqa: E731
    out = [f'<text x="{x0 + W / 2}" y="18" text-anchor="middle" font-weight="bold">'
           f'{esc(title)}</text>',
           f'<text x="{x0 + W / 2}" y="34" text-anchor="middle" fill="#555">{esc(unit)}</text>']
    for k in range(5):  # grid and labels
        v = top / 1.15 * k / 4
        out.append(f'<line x1="{x0 + LEFT}" x2="{x0 + W - 16}" y1="{y(v):.1f}" '
                   f'y2="{y(v):.1f}" stroke="#ddd"/>')
        label = f"{v:,.0f}" if top > 20 else f"{v:.2f}"
        out.append(f'<text x="{x0 + LEFT - 4}" y="{y(v) + 4:.1f}" text-anchor="end" '
                   f'font-size="10">{label}</text>')
    bw = plot_w / len(bars)
    for i, (label, color, runs) in enumerate(bars):
        med = statistics.median(runs)
        bx = x0 + LEFT + i * bw + bw * 0.18
        out.append(f'<rect x="{bx:.1f}" y="{y(med):.1f}" width="{bw * 0.64:.1f}" '
                   f'height="{y(0) - y(med):.1f}" fill="{color}" opacity="0.85"/>')
        for j, r in enumerate(runs):
            dx = bx + bw * 0.64 * (j + 0.5) / len(runs)
            out.append(f'<circle cx="{dx:.1f}" cy="{y(r):.1f}" r="2.2" fill="#222"/>')
        text = f"{med:,.0f}" if med > 20 else f"{med:.2f}"
        out.append(f'<text x="{bx + bw * 0.32:.1f}" y="{y(med) - 5:.1f}" '
                   f'text-anchor="middle" font-size="11">{text}</text>')
        for k, part in enumerate(label.split("\n")):
            out.append(f'<text x="{bx + bw * 0.32:.1f}" y="{H - BOTTOM + 15 + 12 * k}" '
                       f'text-anchor="middle" font-size="10">{esc(part)}</text>')
    if goal:
        out.append(f'<line x1="{x0 + LEFT}" x2="{x0 + W - 16}" y1="{y(goal):.1f}" '
                   f'y2="{y(goal):.1f}" stroke="#2a2" stroke-dasharray="5,3"/>')
        out.append(f'<text x="{x0 + W - 18}" y="{y(goal) - 4:.1f}" text-anchor="end" '
                   f'font-size="10" fill="#2a2">{esc(goal_label)}</text>')
    return out


def main() -> None:
    res = json.loads(Path(sys.argv[1]).read_text())
    ts, st = res["torchspark"], res["stock"]
    stock_lps = statistics.median(st["lines_per_s"])
    panels = [
        ("lines/s to the driver", "4 senders x {:,} lines".format(res["lines"]),
         [("torchspark", COLORS["torchspark"], ts["lines_per_s"]),
          ("PySpark\nLogStreaming", COLORS["stock"], st["lines_per_s"])],
         20 * stock_lps, "goal: 20x stock"),
        ("driver CPU per 1M lines", "seconds (lower is better)",
         [("torchspark", COLORS["torchspark"], ts["cpu_per_mline"]),
          ("PySpark\nLogStreaming", COLORS["stock"], st["cpu_per_mline"])], None, ""),
        ("output shipped", "GB/s, loopback, SHA-256 on both ends",
         [("1 GiB\nmemory", COLORS["torchspark"], res["out_1gib"]),
          ("3 GiB\nmemory", COLORS["torchspark"], res["out_3gib"]),
          ("3 GiB file\ntmpfs", COLORS["torchspark"], res["out_3gib_file"]),
          ("3 GiB driver\nend alone", COLORS["torchspark"], res["out_3gib_driver_alone"]),
          ("3 GiB agent\nend alone", COLORS["torchspark"], res["out_3gib_agent_alone"]),
          ("stock-style\n1 GiB", COLORS["stock"], res["out_stock_1gib"])],
         1.0, "goal: 1 GB/s"),
    ]
    body = []
    x0 = 0
    for title, unit, bars, goal, gl in panels:
        w = max(W, 80 * len(bars) + 70)  # room for each bar's label
        body += panel(x0, title, unit, bars, goal, gl, w)
        x0 += w
    width = x0
    when = "; ".join(x for x in (res.get("date"), res.get("start")) if x)
    foot = "%s (medians of %d; dots: single runs)" % (when, res["runs"])
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{H + 16}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{H + 16}" fill="white"/>', *body,
           f'<text x="8" y="{H + 10}" font-size="10" fill="#555">{esc(foot)}</text>', "</svg>"]
    Path(sys.argv[2]).parent.mkdir(parents=True, exist_ok=True)
    Path(sys.argv[2]).write_text("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
