"""Render the Grafana dashboard's panels as one PNG from a real Prometheus, without Grafana.

    .venv/bin/python -m observability.render_dashboard --prometheus http://127.0.0.1:9090 \
        --minutes 10 --out docs/dashboard.png

Each panel of observability/grafana_dashboard.json becomes a small line chart of its PromQL
targets over the last minutes (`query_range`, the `model` variable at "All"), titled like the
Grafana panel. It is for the README and for a quick look on a headless box; Grafana itself
remains the operator's tool.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import httpx

DASHBOARD = Path(__file__).with_name("grafana_dashboard.json")
Series = tuple[str, list[float], list[float]]  # (legend, unix times, values)


def panels(dashboard: dict) -> list[dict]:
    """Panels with targets, rows flattened, in the dashboard's order."""
    out = []
    for p in dashboard["panels"]:
        out.extend(p.get("panels", []) if p.get("type") == "row" else [p])
    return [p for p in out if p.get("targets")]


def grafana_expr(expr: str) -> str:
    return expr.replace("${model}", ".*").replace("$model", ".*")


def legend(template: str | None, labels: dict[str, str]) -> str:
    if template:
        for k, v in labels.items():
            template = template.replace("{{" + k + "}}", v).replace("{{ " + k + " }}", v)
        return template
    return ",".join(f"{k}={v}" for k, v in labels.items() if k != "__name__") or "value"


def fetch_range(prometheus: str, start: float, end: float, step: float) -> Callable:
    def fetch(expr: str) -> list[tuple[dict, list[float], list[float]]]:
        r = httpx.get(
            f"{prometheus}/api/v1/query_range",
            timeout=30,
            params={"query": expr, "start": start, "end": end, "step": step},
        )
        r.raise_for_status()
        out = []
        for s in r.json()["data"]["result"]:
            points = [(float(t), float(v)) for t, v in s["values"] if math.isfinite(float(v))]
            if points:
                out.append((s["metric"], [t for t, _ in points], [v for _, v in points]))
        return out

    return fetch


def collect(dashboard: dict, fetch: Callable) -> list[tuple[str, str, list[Series]]]:
    """(title, unit, series) per panel; a panel with no data keeps an empty list."""
    result = []
    for p in panels(dashboard):
        series: list[Series] = []
        for t in p["targets"]:
            for labels, times, values in fetch(grafana_expr(t["expr"])):
                series.append((legend(t.get("legendFormat"), labels), times, values))
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        result.append((p["title"], unit, series))
    return result


def render(collected: list[tuple[str, str, list[Series]]], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 3
    rows = math.ceil(len(collected) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 5.2, rows * 2.9), squeeze=False)
    t0 = min((s[1][0] for _, _, ss in collected for s in ss), default=0.0)
    for ax, (name, unit, series) in zip(axes.flat, collected):
        ax.set_title(name, fontsize=9)
        ax.tick_params(labelsize=7)
        if not series:
            ax.text(
                0.5, 0.5, "no data", ha="center", va="center", color="grey", transform=ax.transAxes
            )
        for label, times, values in series[:8]:
            ax.plot([(t - t0) / 60 for t in times], values, label=label[:40], linewidth=1.2)
        if series:
            ax.legend(fontsize=6, loc="upper left")
        ax.set_xlabel(f"minutes{'  (' + unit + ')' if unit else ''}", fontsize=7)
    for ax in list(axes.flat)[len(collected) :]:
        ax.axis("off")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.97))  # room for the title
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prometheus", default="http://127.0.0.1:9090")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=Path("docs/dashboard.png"))
    args = parser.parse_args(argv)
    end = time.time()
    start = end - args.minutes * 60
    step = max(1.0, args.minutes * 60 / 300)
    collected = collect(
        json.loads(DASHBOARD.read_text()), fetch_range(args.prometheus, start, end, step)
    )
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(end))
    render(collected, args.out, f"llmserve dashboard, rendered from {args.prometheus} at {stamp}")
    empty = [name for name, _, series in collected if not series]
    print(f"{args.out}: {len(collected)} panels, {len(empty)} without data {empty}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
