"""The results as a markdown table of figures and ratios to bare aiohttp, and a PNG chart."""
from __future__ import annotations

from pathlib import Path

__all__ = ("ratio", "markdown_table", "draw_chart")

BASELINE = "aiohttp"


def ratio(rows: dict[str, dict], scenario_key: str, target: str) -> float | None:
    """target / bare aiohttp for the same scenario in the same run."""
    base = rows.get(BASELINE, {}).get(scenario_key)
    mine = rows.get(target, {}).get(scenario_key)
    if not base or not mine or not base["value"]:
        return None
    return mine["value"] / base["value"]


def _fmt(value: float, unit: str) -> str:
    if unit in ("events/s", "req/s", "elements/s"):
        return f"{value:,.0f}"
    return f"{value:.1f}"


def markdown_table(scenarios, targets: list[str], rows: dict[str, dict], meta: dict) -> str:
    """`rows[target][scenario_key]` is the kept result; one line per scenario."""
    head = "| scenario | " + " | ".join(targets) + " |"
    lines = [head, "|---" * (len(targets) + 1) + "|"]
    for sc in scenarios:
        cells = []
        for t in targets:
            res = rows.get(t, {}).get(sc.key)
            if res is None:
                cells.append("—")
                continue
            cell = _fmt(res["value"], sc.unit)
            r = ratio(rows, sc.key, t)
            if t != BASELINE and r is not None:
                cell += f" ({r:.2f}×)"
            extra = []
            if "ttfe_p99_ms" in res and sc.key.startswith("streams"):
                extra.append(f"TTFE p99 {res['ttfe_p99_ms']:.0f} ms")
            if "p99_ms" in res:
                extra.append(f"p50 {res['p50_ms']:.1f} / p99 {res['p99_ms']:.1f} ms")
            if res.get("errors"):
                extra.append(f"**{res['errors']} errors**")
            cells.append(cell + ("<br>" + ", ".join(extra) if extra else ""))
        lines.append(f"| {sc.title} ({sc.unit}) | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"Ratios are to bare aiohttp in the same run (higher is better for events/s and req/s, "
                 f"lower for ms and KB). {meta.get('note', '')}".rstrip())
    return "\n".join(lines) + "\n"


def draw_chart(scenarios, targets: list[str], rows: dict[str, dict], path: Path) -> bool:
    """Grouped bars of every target's ratio to bare aiohttp; False when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    others = [t for t in targets if t != BASELINE]
    groups = [(True, "throughput vs bare aiohttp (higher is better)"),
              (False, "latency and memory vs bare aiohttp (lower is better)")]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, (higher, title) in zip(axes, groups, strict=True):
        scs = [s for s in scenarios if s.higher_is_better is higher
               and any(ratio(rows, s.key, t) for t in others)]  # fnstream-only rows have no ratio
        width = 0.8 / max(1, len(others))
        for i, t in enumerate(others):
            values = [ratio(rows, s.key, t) or 0.0 for s in scs]
            xs = [j + (i - (len(others) - 1) / 2) * width for j in range(len(scs))]
            bars = ax.bar(xs, values, width, label=t)
            ax.bar_label(bars, labels=[f"{v:.2f}" if v else "" for v in values], fontsize=7)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_xticks(range(len(scs)))
        ax.set_xticklabels([s.short or s.title for s in scs], fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
