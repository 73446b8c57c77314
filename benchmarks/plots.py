"""PNG plots of a comparison's rows: speed-up vs k per method family, acceptance by position;
of a serving benchmark: throughput and TPOT vs concurrency."""

from __future__ import annotations

import statistics
from pathlib import Path


def write_plots(rows: list[dict], out_prefix: Path, title: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    families = {}
    for r in rows:
        if r["k"]:
            families.setdefault(r["family"], []).append(r)
    for family, rs in families.items():
        rs = sorted(rs, key=lambda r: r["k"])
        ax.plot([r["k"] for r in rs], [r["speedup_vs_nospec"] for r in rs], marker="o", label=family)
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_xlabel("k (drafts per step: gamma / block size)")
    ax.set_ylabel("wall-clock speed-up vs no speculation (median)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    path = out_prefix.with_name(out_prefix.name + "-speedup_vs_k.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        per_pos, drafts = r["accepted_per_position"], r["target_forwards_with_drafts"]
        if per_pos and drafts and "engine_forwards" not in r:  # dLLM rows: block commits, not drafts
            ax.plot(range(1, len(per_pos) + 1), [a / drafts for a in per_pos], marker=".",
                    label=r["method"])
    ax.set_xlabel("draft position")
    ax.set_ylabel("fraction of verification steps accepting it")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    path = out_prefix.with_name(out_prefix.name + "-acceptance_by_position.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written


def write_serve_plot(rows: list[dict], out_prefix: Path, title: str) -> Path:
    """``bench_serve`` rows: output throughput and mean TPOT against concurrency, one line
    per method (and dataset, request rate, when several were run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates, datasets = {r["request_rate"] for r in rows}, {r["dataset"] for r in rows}
    lines: dict[str, list[dict]] = {}
    for r in rows:
        label = r["method"] + (f", {r['dataset']}" if len(datasets) > 1 else "") + \
            (f" @ {r['request_rate']} req/s" if len(rates) > 1 else "")
        lines.setdefault(label, []).append(r)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    for label, rs in lines.items():  # repeated client runs: their median per concurrency
        x = sorted({r["concurrency"] for r in rs})
        for ax, field in ((left, "output_throughput"), (right, "mean_tpot_ms")):
            ax.plot(x, [statistics.median(r[field] for r in rs if r["concurrency"] == c)
                        for c in x], marker="o", label=label)
    for ax, what in ((left, "output throughput (tokens/s)"), (right, "mean TPOT (ms)")):
        ax.set_xlabel("max concurrency (vLLM bench serve --max-concurrency)")
        ax.set_ylabel(what)
        ax.set_xscale("log", base=2)
        ticks = sorted({r["concurrency"] for r in rows})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    path = out_prefix.with_name(out_prefix.name + "-serve.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
