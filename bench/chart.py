"""Draws a bench/run result as an SVG chart: for each comparison, brokkr's throughput as a multiple
of the baseline's, and the baseline's p99 latency as a multiple of brokkr's, so that a longer bar
favours brokkr on both; on a log scale, with 1× (a tie) and each target marked.

    python3 bench/chart.py bench/results/latest.json bench/results/latest.svg

bench/run runs it after each run; docs/benchmarks.md shows the chart it wrote.
"""

import json
import math
import sys
from xml.sax.saxutils import escape

LOW, HIGH = 0.1, 100.0  # the scale's ends
LEFT, BAR_W, ROW_H, TOP = 300, 460, 46, 58
WIDTH = LEFT + BAR_W + 110

# The targets docs/benchmarks.md states, by comparison label and measure.
TARGETS = {
    ("catalog vs openbrokerapi", "throughput"): 20,
    ("catalog vs static handler", "throughput"): 0.7,
    ("lifecycle vs openbrokerapi", "throughput"): 3,
    ("lifecycle vs openbrokerapi", "latency"): 1 / 0.7,
}


def x(ratio):
    ratio = min(max(ratio, LOW), HIGH)
    return LEFT + BAR_W * (math.log10(ratio) - math.log10(LOW)) / (math.log10(HIGH) - math.log10(LOW))


def main():
    source, out = sys.argv[1], sys.argv[2]
    result = json.load(open(source, encoding="utf-8"))
    comparisons = result["comparisons"]
    height = TOP + ROW_H * len(comparisons) + 50
    machine = result["machine"]
    svg = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
        f'<text x="10" y="20" font-size="14" font-weight="bold">brokkr ÷ baseline, measured in one run '
        f'({escape(result["commit"])}, {escape(result["date"][:10])})</text>',
        f'<text x="10" y="38" fill="#555">{escape(result["command"])}; {machine["nproc"]} cores, '
        f'{escape(machine["cpu"])}; longer bars favour brokkr</text>',
    ]
    for tick in (0.1, 0.3, 1, 3, 10, 30, 100):
        tx = x(tick)
        svg.append(f'<line x1="{tx:.1f}" y1="{TOP - 6}" x2="{tx:.1f}" y2="{height - 40}" '
                   f'stroke="{"#333" if tick == 1 else "#ddd"}"/>')
        svg.append(f'<text x="{tx:.1f}" y="{height - 26}" text-anchor="middle">{tick:g}×</text>')
    for i, c in enumerate(comparisons):
        y = TOP + ROW_H * i
        label = c["label"]
        svg.append(f'<text x="{LEFT - 8}" y="{y + 16}" text-anchor="end">{escape(label)}</text>')
        bars = [("throughput", c["throughput_ratio"], "#2b6cb0", y + 4)]
        if c["p99_ratio"]:
            bars.append(("p99 latency", 1 / c["p99_ratio"], "#dd6b20", y + 24))
        for name, ratio, colour, bar_y in bars:
            x0, x1 = x(1), x(ratio)
            svg.append(f'<rect x="{min(x0, x1):.1f}" y="{bar_y}" width="{abs(x1 - x0):.1f}" '
                       f'height="16" fill="{colour}"/>')
            svg.append(f'<text x="{max(x0, x1) + 4:.1f}" y="{bar_y + 12}">{ratio:.2f}× {name}</text>')
            target = TARGETS.get((label, "throughput" if name == "throughput" else "latency"))
            if target:
                tx = x(target)
                svg.append(f'<line x1="{tx:.1f}" y1="{bar_y - 2}" x2="{tx:.1f}" y2="{bar_y + 18}" '
                           f'stroke="#c53030" stroke-width="2" stroke-dasharray="3,2"/>')
    svg.append(f'<text x="10" y="{height - 8}" fill="#555">blue: throughput ÷ baseline; orange: '
               f'baseline p99 ÷ brokkr p99; red dashes: the target</text>')
    svg.append("</svg>")
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(svg) + "\n")


main()
