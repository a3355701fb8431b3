"""``fastload bench``: loaders side by side on the same data, the decode ceiling, data-stall analysis.

``loaders`` (fastload's and the baselines), ``measure`` (rates, costs, the decode ceiling),
``training`` (the data-stall analysis), ``run`` (rounds of fresh processes, medians, ratios),
``report`` (table, JSON, plot).
"""

from fastload.bench.bench_report import format_table, write_outputs
from fastload.bench.bench_rounds import TRANSFORMS, run_bench
from fastload.bench.loaders import BACKENDS
from fastload.bench.measure import time_batches

__all__ = ["BACKENDS", "TRANSFORMS", "format_table", "run_bench", "time_batches", "write_outputs"]
