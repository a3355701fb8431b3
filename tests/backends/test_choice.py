"""backend="auto" decides by measurement: on a GPU a short probe times each engine on the loader's
data and takes the fastest, cached per machine. Here (no GPU) auto is the CPU path without a
probe, and the probe and its cache run with DALI on the CPU against the CPU path."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import fastload
from fastload import transforms as T
from fastload.backends.choice import cached_rates, probe_key, probed_choice
from tests.conftest import demo_dataset

pytest.importorskip("nvidia.dali")


@pytest.fixture(scope="module")
def wds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_dataset(tmp_path_factory.mktemp("probe"), 40)


def test_auto_without_a_gpu_is_the_cpu_path_without_probing(wds: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTLOAD_PROBE_CACHE", str(tmp_path / "probe.json"))
    with fastload.DataLoader(wds, batch_size=8, num_workers=2, transform=T.val(64)) as loader:
        assert loader.backend == "cpu"
    assert not (tmp_path / "probe.json").exists()


def test_the_probe_measures_each_engine_caches_and_takes_the_fastest(wds: Path, tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    cache = tmp_path / "probe.json"
    made: list[str] = []
    specs = T.val(64)

    def make_loader(backend: str) -> fastload.DataLoader:
        made.append(backend)
        return fastload.DataLoader(wds, batch_size=8, num_workers=2, shuffle=True, transform=specs, backend=backend)

    key = probe_key(specs, 2, 8)
    with caplog.at_level(logging.WARNING, logger="fastload"):
        first = probed_choice(key, make_loader, ("cpu", "dali"), gpu=False, path=cache)
    assert made == ["cpu", "dali"] and set(first.rates) == {"cpu", "dali"} and min(first.rates.values()) > 0
    fastest = max(first.rates, key=first.rates.__getitem__)
    assert first.engine == fastest and first.name == ("cpu" if fastest == "cpu" else "dali-cpu")
    assert "backend=auto measured cpu" in caplog.text and "probe on this machine" in first.why
    assert cached_rates(key, cache) == first.rates and key in json.loads(cache.read_text())["probes"]

    again = probed_choice(key, make_loader, ("cpu", "dali"), gpu=False, path=cache)
    assert made == ["cpu", "dali"] and again.name == first.name and "cached probe" in again.why  # nothing probed again
    other = probe_key(T.train(64), 2, 8)  # another transform kind: probed anew
    assert other != key and cached_rates(other, cache) is None


def test_a_cache_of_another_version_or_garbage_is_probed_again(wds: Path, tmp_path: Path) -> None:
    cache = tmp_path / "probe.json"
    cache.write_text("{not json")
    key = probe_key(T.val(64), 1, 8)
    assert cached_rates(key, cache) is None
    choice = probed_choice(key, lambda backend: fastload.DataLoader(wds, batch_size=8, num_workers=1, transform=T.val(64),
                                                                     backend=backend), ("cpu",), gpu=False, path=cache)
    assert choice.name == "cpu" and cached_rates(key, cache) == choice.rates
