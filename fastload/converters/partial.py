"""The bookkeeping of an unfinished conversion in ``OUT/.fastload-partial/``: the options it was
started with, a result file per finished shard (what it was made from), and, for ``--dedupe
near``, the signatures of each run of items already signed, so a resumed run signs only the rest.

Every file here is bookkeeping only: one lost to a crash means work done again, never a wrong
shard (a result file is written after its shard's data was fsynced).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path

from fastload._util.files import atomic_write_bytes, naming
from fastload.converters.shard import ShardResult
from fastload.formats.shard_info import ShardInfo
from fastload.storage import remote

PARTIAL_DIR = ".fastload-partial"
REMOVED_SUFFIX = ".removed"  # a partial folder being deleted


class ConversionConflict(RuntimeError):
    """OUT holds a dataset or a partial conversion made with other options."""


def check_partial(partial: Path, fingerprint: dict) -> None:
    """Record ``fingerprint`` for a new conversion, or refuse to resume one started with another."""
    plan_file = partial / "plan.json"
    if plan_file.exists():
        previous = json.loads(plan_file.read_text())
        if previous != fingerprint:
            raise ConversionConflict(
                f"{partial.parent} holds an unfinished conversion made with other options or input; "
                f"rerun it with the same options, or delete {partial} to start over"
            )
    else:
        if any(partial.glob("shard-*.json")):  # results no plan vouches for: never reused (a plan's temporary file is no matter)
            raise ConversionConflict(
                f"{partial} holds shard results without the plan they were made for; delete it to start over"
            )
        partial.mkdir(parents=True, exist_ok=True)
        _write_json(plan_file, fingerprint)


def remove_partial(partial: Path) -> None:
    """Delete a finished conversion's bookkeeping: renamed away first (one atomic step), so a
    kill part-way through never leaves shard results without their plan for a rerun to trust."""
    if partial.exists():
        doomed = partial.with_name(partial.name + REMOVED_SUFFIX)
        shutil.rmtree(doomed, ignore_errors=True)  # a previous removal's remains
        os.replace(partial, doomed)
        shutil.rmtree(doomed)


def _write_json(path: Path, obj: object) -> None:
    with naming(path):
        atomic_write_bytes(path, json.dumps(obj, sort_keys=True).encode(), durable=False)


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def save_result(partial: Path, name: str, result: ShardResult) -> None:
    """Record that shard ``name`` is finished (after its data is durable)."""
    _write_json(partial / f"{name}.json", asdict(result))


def _load_result(path: Path) -> ShardResult | None:
    data = _read_json(path)
    if data is None:
        return None
    info = ShardInfo(**data.pop("info")) if data.get("info") else None
    data.pop("info", None)
    data["class_counts"] = {int(k): v for k, v in data["class_counts"].items()}
    return ShardResult(info=info, **data)


def finished_result(
    out: Path, partial: Path, name: str, sources: str, url: str | None, pixel_shape: tuple[int, ...] | None = None
) -> tuple[ShardResult | None, bool]:
    """The result of shard ``name`` if a previous run finished it from the sources as they are now
    (``sources``: their digest), holding pixels of ``pixel_shape`` if it holds any (the dataset's
    shape comes from its first image, which may have changed), and it is in place (the file under
    OUT, or the object of the right size at the URL); and whether one was finished from sources
    that have changed since."""
    result = _load_result(partial / f"{name}.json")
    if result is None:
        return None, False
    if result.sources != sources or (result.pixel_shape is not None and tuple(result.pixel_shape) != pixel_shape):
        return None, True
    if result.info is not None:
        if url is None and not (out / result.info.path).is_file():
            return None, False
        if url is not None and remote.size(remote.join(url, result.info.path)) != result.info.bytes:
            return None, False
    return result, False


def remove_unplanned_shards(out: Path, partial: Path, planned: set[str], url: str | None) -> None:
    """Delete the files (under OUT, or the objects at ``url``) of shards a previous run finished
    that the plan no longer has: with ``--dedupe near`` a changed source can change the drops,
    hence the number of shards."""
    for path in partial.glob("shard-*.json"):
        name = path.name.removesuffix(".json")
        result = _load_result(path)
        if name in planned or result is None or result.info is None:
            continue
        for file in (result.info.path, result.info.offsets, result.info.table):
            if file and url is not None:
                remote.remove(remote.join(url, file))
            elif file:
                (out / file).unlink(missing_ok=True)


SIGNATURES_FILE = "signatures.jsonl"


class SignatureLog:
    """The signatures of each run of items signed so far, one JSON line a run, appended as runs
    come back (a line torn by a crash is ignored) and read back by a rerun."""

    def __init__(self, partial: Path) -> None:
        self.path = partial / SIGNATURES_FILE
        self._saved: dict[tuple[int, str], list[int | None]] = {}
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            lines = []
        for line in lines:
            try:
                entry = json.loads(line)
                self._saved[entry["run"], entry["sources"]] = entry["signatures"]
            except (json.JSONDecodeError, KeyError, TypeError):
                continue

    def saved(self, run: int, sources: str) -> list[int | None] | None:
        """The signatures recorded for run ``run``, if made from the same sources (their digest)."""
        return self._saved.get((run, sources))

    def save(self, run: int, sources: str, signatures: list[int | None]) -> None:
        """Record run ``run``'s signatures (bookkeeping: not fsynced)."""
        with naming(self.path), self.path.open("a") as log:
            log.write(json.dumps({"run": run, "sources": sources, "signatures": signatures}) + "\n")
