"""Engines execute independent tasks (shards, hash batches) and yield results as they finish."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class ConversionEngine(Protocol):
    """Runs ``fn`` over tasks; yields ``(task position, result)`` in completion order."""

    def map_unordered(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[tuple[int, R]]:
        """Run every task; re-raise the first task error in the caller."""


ENGINES = ("local", "ray")


def open_engine(name: str, workers: int, address: str | None = None) -> ConversionEngine:
    """The engine called ``name``: "local" (a process pool) or "ray" (a Ray cluster at ``address``)."""
    if name == "local":
        from fastload.converters.engines.local import LocalEngine

        return LocalEngine(workers)
    if name == "ray":
        from fastload.converters.engines.ray import RayEngine

        return RayEngine(workers, address)
    raise ValueError(f"unknown engine {name!r}; expected one of {ENGINES}")
