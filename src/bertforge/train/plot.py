"""`bertforge plot RUN`: training curves from RUN/metrics.jsonl as a PNG."""

from __future__ import annotations

from pathlib import Path

from ..errors import BertforgeError
from ..fileio import atomic_path
from .logs import read_metrics

# (panel title, [(metric, label)])
PANELS = [
    (
        "loss",
        [
            ("mlm_loss", "train MLM"),
            ("nsp_loss", "train NSP"),
            ("eval_mlm_loss", "held-out MLM"),
            ("loss", "train total"),
        ],
    ),
    ("held-out MLM perplexity", [("eval_perplexity", "perplexity")]),
    ("MLM accuracy", [("mlm_acc", "train"), ("eval_mlm_acc", "held-out")]),
    ("NSP accuracy", [("nsp_acc", "train"), ("eval_nsp_acc", "held-out")]),
    ("learning rate", [("lr", "lr")]),
    ("throughput", [("tokens_per_s", "tokens/s")]),
    ("gradient norm", [("grad_norm", "before clipping")]),
]


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    if not records:
        raise BertforgeError(f"{run_dir}: no metrics.jsonl (or it is empty): nothing to plot")
    out_path = Path(out) if out else run_dir / "curves.png"
    panels = [
        (title, [(k, lab) for k, lab in series if any(k in r for r in records)])
        for title, series in PANELS
    ]
    panels = [p for p in panels if p[1]]
    cols = 2
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(12, 3.6 * rows), squeeze=False)
    for ax, (title, series) in zip(axes.flat, panels):
        for key, label in series:
            points = [(r["step"], r[key]) for r in records if key in r]
            ax.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                label=label,
                marker="." if len(points) < 30 else None,
            )
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if title == "held-out MLM perplexity":
            ax.set_yscale("log")
        if len(series) > 1:
            ax.legend()
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(str(run_dir))
    fig.tight_layout()
    with atomic_path(out_path) as tmp:  # PNG whatever the name says; never half-written
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
    return out_path
