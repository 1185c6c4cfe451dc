"""mAP against training minutes, from the CSV logs of runs trained with ``ElapsedTime``.

    python tools/plot_logs.py --vs_minutes detr=outputs/conv/runs/detr deform=outputs/conv/runs/deform --output conv.png

Each positional argument is ``[LABEL=]PATH``; ``PATH`` is a ``metrics.csv`` or a folder searched
for them (e.g. one run per seed). Every CSV becomes one line; the runs of one argument share a
colour and one legend entry. The x axis is ``time/elapsed_min`` (logged by
:class:`visiontf.callbacks.ElapsedTime` at each validation), the y axis a validation metric
(default ``val/map``, COCO mAP@[.5:.95]).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

TIME_KEY = "time/elapsed_min"
METRIC_KEY = "val/map"
METRIC_LABELS = {"val/map": "COCO mAP@[.5:.95] (validation)", "val/mAP": "COCO mAP@[.5:.95] (validation)",
                 "val/map_50": "COCO AP50 (validation)"}


def metrics_csvs(path: str | Path) -> list[Path]:
    """``path`` itself if it is a file, else every ``metrics.csv`` below it (sorted by path)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: neither a metrics.csv nor a folder")
    found = sorted(path.rglob("metrics.csv"))
    if not found:
        raise FileNotFoundError(f"{path}: no metrics.csv below it (was the run logged with a CSVLogger?)")
    return found


def read_curve(csv: str | Path, metric: str = METRIC_KEY, time_key: str = TIME_KEY) -> pd.DataFrame:
    """Rows of one CSVLogger file where both the metric and the time were logged: ``minutes``, ``value``, ``epoch``, ``step``."""
    df = pd.read_csv(csv)
    missing = [k for k in (metric, time_key) if k not in df.columns]
    if missing:
        hint = (" Train with --trainer.callbacks+=visiontf.callbacks.ElapsedTime to log the time."
                if time_key in missing else "")
        raise ValueError(f"{csv}: no column {missing}; logged: {sorted(df.columns)[:20]}.{hint}")
    rows = df.dropna(subset=[metric, time_key])
    out = pd.DataFrame({"minutes": rows[time_key].astype(float), "value": rows[metric].astype(float),
                        "epoch": rows["epoch"] if "epoch" in rows else float("nan"),
                        "step": rows["step"] if "step" in rows else float("nan")})
    return out.sort_values("minutes").reset_index(drop=True)


def parse_run_arg(arg: str) -> tuple[str, Path]:
    """``LABEL=PATH`` or ``PATH`` (label: the folder's name)."""
    if "=" in arg and not Path(arg).exists():
        label, path = arg.split("=", 1)
        return label, Path(path)
    path = Path(arg)
    return (path.parent.name if path.is_file() else path.name), path


def plot_convergence(runs: Sequence[tuple[str, str | Path]], output: str | Path, metric: str = METRIC_KEY,
                     time_key: str = TIME_KEY, title: str | None = None) -> Path:
    """One PNG: ``metric`` against training minutes, one line per CSV, one colour per label.

    ``runs``: ``(label, path)`` pairs; pairs with the same label share a colour (e.g. one per seed).
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.8), dpi=110)
    ax = fig.subplots()
    groups: dict[str, list[Path]] = {}  # one colour per label; a label may name several paths
    for label, path in runs:
        groups.setdefault(label, []).extend(metrics_csvs(path))
    right = 0.0
    for i, (label, csvs) in enumerate(groups.items()):
        for j, csv in enumerate(csvs):
            curve = read_curve(csv, metric, time_key)
            right = max(right, float(curve["minutes"].max()) if len(curve) else 0.0)
            legend = f"{label} ({len(csvs)} runs)" if len(csvs) > 1 else label
            ax.plot(curve["minutes"], curve["value"], color=f"C{i % 10}", marker="o", markersize=3,
                    linewidth=1.6, alpha=0.85, label=legend if j == 0 else None)
    ax.set_xlabel("training minutes (wall clock, validation included)" if time_key == TIME_KEY else time_key)
    ax.set_ylabel(METRIC_LABELS.get(metric, metric))
    ax.set_ylim(bottom=0)
    ax.set_xlim(0, right * 1.04 if right > 0 else 1.0)  # room for the last point
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    ax.set_title(title or f"{METRIC_LABELS.get(metric, metric)} against training time")
    fig.tight_layout()
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output)
    return output


def main(argv: Sequence[str] | None = None) -> int:
    from visiontf.core.arguments import ToolParser

    p = ToolParser(prog="plot_logs.py --vs_minutes",
                   description="Plot a validation metric against training minutes, one line per run.")
    p.add_argument("runs", nargs="+", help="[LABEL=]PATH: a metrics.csv or a folder of runs (one colour per argument)")
    p.add_argument("--output", default="convergence.png")
    p.add_argument("--metric", default=METRIC_KEY, help=f"validation metric column (default {METRIC_KEY})")
    p.add_argument("--time_key", default=TIME_KEY, help=f"x column (default {TIME_KEY})")
    p.add_argument("--title", default=None)
    args = p.parse_args(argv)
    runs = [parse_run_arg(a) for a in args.runs]
    out = plot_convergence(runs, args.output, args.metric, args.time_key, args.title)
    print(f"wrote {out} ({len(runs)} groups)")
    return 0


__all__ = ["metrics_csvs", "parse_run_arg", "plot_convergence", "read_curve"]
