"""Convert on a Ray cluster: one Ray task per shard, written straight to the shared output
location; the driver plans, tracks progress and writes the index. (The only module importing ray.)"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

TASK_RETRIES = 3  # a task whose worker or node is lost, or that hits an OSError, runs again


def import_ray():
    """The ray module, or an error naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise ImportError("--engine ray needs Ray: pip install 'fastload[ray]'") from None
    return ray


class RayEngine:
    """Runs tasks as Ray tasks; connects to ``address`` ("auto", "ray://HOST:PORT") or starts a
    local Ray with ``workers`` CPUs. At most two tasks per cluster CPU are in flight."""

    def __init__(self, workers: int, address: str | None = None) -> None:
        self.ray = import_ray()
        if not self.ray.is_initialized():
            if address:
                self.ray.init(address=address, logging_level="WARNING")
            else:
                self.ray.init(num_cpus=workers, include_dashboard=False, logging_level="WARNING")
        self.in_flight = 2 * max(1, int(self.ray.cluster_resources().get("CPU", workers)))

    def map_unordered(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[tuple[int, R]]:
        """Yield (position, result) as tasks finish; a task's error (after retries) is re-raised."""
        remote = self.ray.remote(max_retries=TASK_RETRIES, retry_exceptions=[OSError])(fn)
        pending: dict = {}
        todo = iter(enumerate(tasks))
        try:
            while True:
                for position, task in todo:
                    pending[remote.remote(task)] = position
                    if len(pending) >= self.in_flight:
                        break
                if not pending:
                    return
                (ready,), _ = self.ray.wait(list(pending), num_returns=1)
                position = pending.pop(ready)
                yield position, self.ray.get(ready)
        finally:
            for ref in pending:
                self.ray.cancel(ref)
