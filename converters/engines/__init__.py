"""Engines execute independent tasks (shards, hash batches) and yield results as they finish."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Engine(Protocol):
    """Runs ``fn`` over tasks; yields ``(task position, result)`` in completion order."""

    def map_unordered(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[tuple[int, R]]:
        """Run every task; re-raise the first task error in the caller."""


def open_engine(name: str, workers: int) -> Engine:
    """The engine called ``name`` ("local")."""
    if name == "local":
        from converters.engines.local import LocalEngine

        return LocalEngine(workers)
    raise ValueError(f"unknown engine {name!r}; expected 'local'")
