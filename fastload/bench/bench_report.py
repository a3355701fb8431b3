"""``fastload bench``'s report: the terminal table, the JSON file and the plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def format_table(report: dict[str, Any], gpu_price: float | None = None, dataset_size: int | None = None) -> str:
    """The terminal table: one row per loader and worker count."""
    ceiling = report["ceiling"]["single_thread_images_per_s"]
    together = ", ".join(
        f"{rate:.0f} with {w} threads ({rate / (int(w) * ceiling):.2f}x)" for w, rate in report["ceiling"]["parallel_images_per_s"].items()
    )
    lines = [
        f"decode ceiling: {ceiling:.0f} images/s per thread (x workers)" if ceiling else "decode ceiling: none (no JPEG images)",
        *([f"decoding at once: {together}"] if together else []),
        f"{'loader':14} {'workers':>7} {'images/s':>9} {'running':>8} {'MB/s':>7} {'CPU s/1k':>9} {'RSS MB':>7} {'1st batch':>9} "
        f"{'x torch':>8} {'x ceiling':>9} {'x at once':>9}",
    ]
    for r in report["results"]:
        torch_ratio = f"{r['ratio_to_torch']:.2f}" if r["ratio_to_torch"] else "-"
        ceiling_ratio = f"{r['ratio_to_ceiling']:.2f}" if r["ratio_to_ceiling"] else "-"
        parallel_ratio = f"{r['ratio_to_parallel']:.2f}" if r["ratio_to_parallel"] else "-"
        lines.append(
            f"{r['loader']:14} {r['workers']:>7} {r['images_per_s']:9.0f} {r['running_images_per_s']:8.0f} {r['mb_per_s']:7.1f} "
            f"{r['cpu_s_per_1k']:9.2f} {r['peak_rss_mb']:7.0f} {r['first_batch_s']:8.2f}s {torch_ratio:>8} {ceiling_ratio:>9} {parallel_ratio:>9}"
        )
    stall = report.get("data_stall")
    if stall:
        lines.append(
            f"data stall ({stall['model']} on {stall['device']}, {stall['loader']} x{stall['workers']}): "
            f"model alone {stall['model_images_per_s']:.0f} images/s, fed {stall['fed_images_per_s']:.0f} images/s; {stall['verdict']}"
        )
    if gpu_price is not None and dataset_size:
        best = max(report["results"], key=lambda r: r["images_per_s"])
        rate = min(best["images_per_s"], stall["fed_images_per_s"]) if stall else best["images_per_s"]
        hours = dataset_size / rate / 3600
        lines.append(f"one epoch of {dataset_size} images at {rate:.0f} images/s: {hours * 60:.1f} min, ${hours * gpu_price:.2f} at ${gpu_price}/h")
    return "\n".join(lines)


def write_outputs(report: dict[str, Any], json_path: Path | None, plot_path: Path | None) -> str | None:
    """Write the JSON and, when matplotlib is installed, the throughput-vs-workers plot."""
    if json_path:
        json_path.write_text(json.dumps(report, indent=1))
    if not plot_path:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install matplotlib)"
    fig, ax = plt.subplots(figsize=(6, 4))
    for loader in dict.fromkeys(r["loader"] for r in report["results"]):
        rows = [r for r in report["results"] if r["loader"] == loader]
        ax.plot([r["workers"] for r in rows], [r["images_per_s"] for r in rows], marker="o", label=loader)
    ax.set_xlabel("workers")
    ax.set_ylabel("images/s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(plot_path)
    return None
