"""PNG plots of a benchmark run (matplotlib, the one module that imports it)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt


def cdf(
    path: Path, series: dict[str, Sequence[float]], title: str, xlabel: str, log: bool = True
) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, values in series.items():
        ordered = sorted(values)
        if not ordered:
            continue
        ys = [(i + 1) / len(ordered) for i in range(len(ordered))]
        ax.plot(ordered, ys, label=name)
    if log:
        ax.set_xscale("log")
    ax.set(title=title, xlabel=xlabel, ylabel="fraction of requests")
    ax.axhline(0.99, color="grey", lw=0.6, ls=":")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def versus_load(
    path: Path, runs: list[dict[str, Any]], metric: str, title: str, ylabel: str
) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy in dict.fromkeys(r["policy"] for r in runs):
        points = sorted((r["rate_rps"], r[metric]) for r in runs if r["policy"] == policy)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=policy)
    ax.set(title=title, xlabel="arrival rate (requests/s)", ylabel=ylabel)
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def bars(path: Path, values: dict[str, float | None], title: str, ylabel: str) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    names = list(values)
    ax.bar(names, [values[n] or 0.0 for n in names], color="tab:blue")
    ax.set(title=title, ylabel=ylabel)
    ax.tick_params(axis="x", rotation=20)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def over_time(path: Path, runs: dict[str, dict[str, Any]], title: str) -> Path:
    """A burst as it happened, one line per policy: requests waiting (in steersman's queue and
    in the engines), mean KV usage, and the TTFT of the requests arriving then (P90 per 5 s)."""
    fig, axes = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    for name, run in runs.items():
        samples = run["samples"]
        times = [s[0] for s in samples]
        axes[0].plot(times, [s[1] + s[2] for s in samples], label=name)
        axes[1].plot(times, [s[3] for s in samples], label=name)
        buckets: dict[int, list[float]] = {}
        for arrival, ttft in run["ttft_by_arrival"]:
            buckets.setdefault(int(arrival // 5), []).append(ttft)
        keys = sorted(buckets)
        p90 = [sorted(buckets[k])[int(0.9 * (len(buckets[k]) - 1))] for k in keys]
        axes[2].plot([5 * k + 2.5 for k in keys], p90, label=name)
    axes[0].set(title=title, ylabel="requests waiting")
    axes[1].set(ylabel="KV cache usage")
    axes[2].set(ylabel="TTFT P90 (s)", xlabel="seconds", yscale="log")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
