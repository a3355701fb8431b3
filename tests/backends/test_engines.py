"""One way to add a backend: every ``backend=`` name but ``auto`` has its engine in
fastload.backends.engines (the engines themselves: test_dali, test_hybrid, the loading suites)."""

from __future__ import annotations

from fastload.backends.engines import ENGINES
from fastload.loading.loader_options import BACKENDS


def test_every_backend_name_has_an_engine() -> None:
    assert set(ENGINES) | {"auto"} == set(BACKENDS)
