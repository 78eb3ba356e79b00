"""Bar charts of benchmark rows (matplotlib, from the `bench` extra), for the README."""

from __future__ import annotations

from collections.abc import Sequence


def throughput_and_ttft(rows: Sequence[dict], path: str, title: str) -> None:
    """Two panels: output tokens/s and TTFT p50, one bar per server at each concurrency.

    `rows`: loadgen reports with a "server" label (bench/compare.py's rows)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    servers = list(dict.fromkeys(r["server"] for r in rows))
    levels = sorted({r["concurrency"] for r in rows})
    width = 0.8 / max(1, len(servers))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for panel, (key, label) in zip(
        axes, (("output_tok_s", "output tokens/s"), ("ttft_p50_s", "TTFT p50 (s)")), strict=True
    ):
        for i, server in enumerate(servers):
            values = [
                next((r[key] for r in rows if r["server"] == server and r["concurrency"] == c), 0)
                for c in levels
            ]
            xs = [j + i * width for j in range(len(levels))]
            panel.bar(xs, values, width, label=server)
        panel.set_xticks([j + width * (len(servers) - 1) / 2 for j in range(len(levels))])
        panel.set_xticklabels([f"c={c}" for c in levels])
        panel.set_ylabel(label)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def agents_panels(rows: Sequence[dict], path: str, title: str) -> None:
    """Three panels, one bar per server: wall time (with the floor's cost marked), TTFT
    p50 of turns 2+, and prompt tokens computed (with the floor marked).

    `rows`: bench/agents.py's rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    servers = [r["server"] for r in rows]
    panels = (
        ("wall_s", "wall time (s)", "floor_cost_s"),
        ("ttft_p50_later_s", "TTFT p50, turns 2+ (s)", None),
        ("computed_tokens", "prompt tokens computed", "floor_tokens"),
    )
    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    for panel, (key, label, floor) in zip(axes, panels, strict=True):
        panel.bar(
            range(len(rows)), [r[key] for r in rows], color=[f"C{i}" for i in range(len(rows))]
        )
        if floor:  # the workload's floor: the same for every server, drawn once
            panel.axhline(min(r[floor] for r in rows), color="black", linestyle="--", label="floor")
            panel.legend(fontsize=8)
        panel.set_xticks(range(len(rows)))
        panel.set_xticklabels(servers, rotation=20, fontsize=8)
        panel.set_ylabel(label)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
