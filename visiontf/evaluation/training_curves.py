"""Training curves from Lightning's CSVLogger ``metrics.csv`` (and TensorBoard event files)."""
from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

log = logging.getLogger(__name__)

#: validation metrics worth a panel, matched as substrings of the logged names (case-insensitive)
METRIC_KEYS = ("map", "miou", "macc", "aacc", "acc")


def find_metrics_csv(path: str | Path) -> list[Path]:
    """``metrics.csv`` itself, or every one under a run folder (oldest version first)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: neither a metrics.csv nor a run folder")
    return sorted(path.rglob("metrics.csv"), key=lambda p: p.stat().st_mtime)


def read_metrics_csv(path: str | Path) -> pd.DataFrame:
    """One long table (``step``, ``epoch``, ``name``, ``value``) from a CSVLogger file."""
    df = pd.read_csv(path)
    if "step" not in df.columns:
        raise ValueError(f"{path}: no 'step' column; expected a Lightning CSVLogger metrics.csv")
    id_vars = [c for c in ("step", "epoch") if c in df.columns]
    long = df.melt(id_vars=id_vars, var_name="name", value_name="value").dropna(subset=["value"])
    if "epoch" not in long.columns:
        long["epoch"] = float("nan")
    return long[["step", "epoch", "name", "value"]]


def read_tensorboard(path: str | Path) -> pd.DataFrame:
    """Scalars of every TensorBoard event file under ``path`` as (``step``, ``epoch``, ``name``, ``value``)."""
    from tensorboard.backend.event_processing import event_accumulator

    rows = []
    files = [Path(path)] if Path(path).is_file() else sorted(Path(path).rglob("events.out.tfevents.*"))
    for f in files:
        acc = event_accumulator.EventAccumulator(str(f), size_guidance={event_accumulator.SCALARS: 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            rows.extend((e.step, float("nan"), tag, e.value) for e in acc.Scalars(tag))
    df = pd.DataFrame(rows, columns=["step", "epoch", "name", "value"])
    if not df.empty:
        # epoch is itself logged as a scalar by Lightning: map it onto the other rows by step
        epochs = df[df.name == "epoch"].drop_duplicates("step").set_index("step")["value"]
        df["epoch"] = df["step"].map(epochs)
        df = df[df.name != "epoch"]
    return df


def load_run(path: str | Path, tensorboard: bool = False) -> pd.DataFrame:
    """Metrics of a run folder or CSV file (all CSVLogger versions concatenated; TensorBoard if asked or no CSV)."""
    frames = [read_metrics_csv(p) for p in find_metrics_csv(path)]
    if tensorboard or not frames:
        tb = read_tensorboard(path)
        if not tb.empty:
            frames.append(tb)
    if not frames:
        raise FileNotFoundError(f"{path}: no metrics.csv and no TensorBoard event files")
    return pd.concat(frames, ignore_index=True)


def _series(df: pd.DataFrame, name: str, x: str) -> pd.DataFrame:
    s = df[df.name == name].dropna(subset=[x]) if x in df else df[df.name == name]
    return s.groupby(x, as_index=False)["value"].mean().sort_values(x)


def plot_curves(df: pd.DataFrame, output: str | Path, title: str | None = None) -> Path:
    """Losses vs step, validation metrics vs epoch, learning rate vs step: one PNG."""
    from matplotlib.figure import Figure

    names = sorted(df.name.unique())
    losses = [n for n in names if "loss" in n.lower()]
    metrics = [n for n in names if n not in losses and n.lower().startswith(("val", "test"))
               and any(k in n.lower().split("/")[-1] for k in METRIC_KEYS)]
    lrs = [n for n in names if n.lower().startswith("lr")]
    panels = [("loss", losses, "step"), ("validation metrics", metrics, "epoch"), ("learning rate", lrs, "step")]
    panels = [p for p in panels if p[1]]
    if not panels:
        raise ValueError(f"nothing to plot: logged names are {names[:20]}")
    fig = Figure(figsize=(6 * len(panels), 4.2), dpi=100)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (label, cols, x) in zip(axes, panels):
        for n in cols:
            s = _series(df, n, x)
            if s.empty and x == "epoch":
                s, x_used = _series(df, n, "step"), "step"
            else:
                x_used = x
            ax.plot(s[x_used], s["value"], marker="o" if len(s) < 30 else None, markersize=3, label=n)
            ax.set_xlabel(x_used)
        ax.set_title(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        if label == "loss" and any(df[df.name.isin(cols)].value > 0):
            ax.set_yscale("log")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output)
    return output


def main(argv: Sequence[str] | None = None) -> int:
    """``tools/plot_logs.py RUN --output curves.png [--tensorboard]``."""
    from visiontf.core.arguments import ToolParser

    p = ToolParser(prog="plot_logs.py", description="Plot losses and validation metrics of a visiontf run.")
    p.add_argument("run", help="run folder (searched for metrics.csv / TensorBoard events) or a metrics.csv")
    p.add_argument("--output", default="curves.png")
    p.add_argument("--tensorboard", action="store_true", help="also read TensorBoard event files")
    args = p.parse_args(argv)
    df = load_run(args.run, tensorboard=args.tensorboard)
    out = plot_curves(df, args.output, title=str(args.run))
    print(f"wrote {out} ({df.name.nunique()} series)")
    return 0
