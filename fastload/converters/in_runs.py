"""A conversion in one pass of runs: the engine's workers read each item once and prepare it for
its shard (and, for ``--dedupe near``, sign it), a run of RUN items a task; the caller takes the
runs back in plan order, decides the near-duplicate drops (the first occurrence kept,
fastload.near.search) and writes each kept sample into its shard behind that decision. The
work is spread over the workers sample by sample rather than shard by shard, so a conversion
whose samples cost CPU (re-encoding, resizing, decoding for HDF5) keeps every worker busy to the
end however few its shards; the survivors and bytes are the same for any worker count, and the
same as the shard-by-shard path's (fastload.converters.conversion) for the same options.

Resumable like any conversion (fastload.converters.partial): each run's signatures are saved as
it comes back and a finished shard leaves its result file; a rerun signs only the runs not saved,
decides again (the same drops: the same signatures in the same order), and keeps each finished
shard made from the same sources (the one it writes again from the prepared samples is dropped
unpublished).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from fastload._util.files import naming
from fastload.converters.convert_options import ConvertOptions
from fastload.converters.dedupe import Duplicate
from fastload.converters.engines import ConversionEngine
from fastload.converters.partial import SignatureLog, finished_result, remove_unplanned_shards, save_result
from fastload.converters.plan import ShardCutter, shard_name
from fastload.converters.sample import SourceItem
from fastload.converters.shard import (
    ShardBuilder,
    ShardResult,
    WrittenShards,
    check_decoded_shape,
    prepare_sample,
    sources_digest,
)
from fastload.converters.sources import Source
from fastload.errors import SampleError
from fastload.formats.writing import PreparedSample

RUN = 64  # items a task: small enough to keep both workers busy to the end, and the results in flight small
Result = TypeVar("Result")


@dataclass(frozen=True)
class AsLoaded:
    """A sample whose preparation left it as the source gives it (a plain JPEG or PNG), stored
    under ``image_field``: the caller loads it again rather than the worker sending its bytes."""

    image_field: str | None


Prepared = PreparedSample | AsLoaded | SampleError


@dataclass(frozen=True)
class RunTask:
    """A run of consecutive items to prepare, and to sign when ``sign`` (near dedupe, its
    signatures not saved by an earlier run)."""

    source: Source
    items: tuple[SourceItem, ...]
    options: ConvertOptions
    sign: bool


def prepare_run(task: RunTask) -> tuple[list[int | None] | None, list[Prepared]]:
    """Each item's signature (None: no image, or it does not decode; the whole list None when
    not asked for) and its prepared sample (AsLoaded where preparing changed nothing) or the
    SampleError preparing it raised, from one read."""
    from fastload.near.signature import RunSigner

    signer = RunSigner(len(task.items)) if task.sign else None
    prepared: list[Prepared] = []
    for position, item in enumerate(task.items):
        try:
            sample = task.source.load(item)
        except SampleError as exc:
            prepared.append(exc)
            continue
        if signer is not None and sample.image is not None:
            try:
                signer.add(position, sample.image, item.where, task.options.max_pixels)
            except SampleError:
                pass  # not signed: kept, and the shard reports it if it does not prepare either
        try:
            ready = prepare_sample(sample, task.options, None)  # the shape is checked in plan order
        except SampleError as exc:
            prepared.append(exc)
            continue
        unchanged = ready.image is sample.image and ready.extra is sample.extra  # a video re-encoded or probed: sent as prepared
        prepared.append(AsLoaded(ready.image_field) if unchanged else ready)
    return (signer.signatures() if signer is not None else None), prepared


def in_plan_order(results: Iterator[tuple[int, Result]]) -> Iterator[tuple[int, Result]]:
    """(position, result) pairs from an engine, reordered by position (each held until the ones
    before it have come)."""
    waiting: dict[int, Result] = {}
    following = 0
    for position, result in results:
        waiting[position] = result
        while following in waiting:
            yield following, waiting.pop(following)
            following += 1


class _ShardStream:
    """The kept samples, in plan order, into consecutive shards: each shard is written as its
    samples come and, when the next begins, published, or dropped for the copy a previous run
    finished from the same sources."""

    def __init__(self, out: Path, partial: Path, url: str | None, options: ConvertOptions) -> None:
        self.out, self.partial, self.url, self.options = out, partial, url, options
        self.cutter = ShardCutter(options.shard_bytes, options.samples_per_shard)
        self.done = WrittenShards()
        self.decoded_shape: tuple[int, ...] | None = None
        self._shard: ShardBuilder | None = None

    def add(self, item: SourceItem, prepared: PreparedSample | SampleError) -> None:
        """Append one kept sample (or why it could not be prepared) to its shard, in plan order."""
        if self.cutter.starts_shard(item):
            self.close()
            number = len(self.done.results)
            name = shard_name(number, self.options.layout)
            with naming(self.out / name):
                self._shard = ShardBuilder(number, self.out, name, self.options)
        assert self._shard is not None  # the first item always starts a shard
        if self.options.writer_options.hdf5_decoded and isinstance(prepared, PreparedSample):
            try:  # the dataset's shape: that of the first kept sample that prepares
                check_decoded_shape(prepared.image, item.where, self.decoded_shape)
                self.decoded_shape = self.decoded_shape or getattr(prepared.image, "shape", None)
            except SampleError as exc:
                prepared = exc
        self._shard.add(item, prepared)

    def close(self) -> None:
        """Finish the shard being written: keep a previous run's copy of it, or publish it."""
        shard, self._shard = self._shard, None
        if shard is None:
            return
        earlier, changed = finished_result(
            self.out, self.partial, shard.path.name, sources_digest(tuple(shard.items)), self.url, self.decoded_shape
        )
        self.done.changed += changed
        result: ShardResult
        if earlier is not None:
            shard.abort()
            result = earlier
            self.done.reused += earlier.info is not None  # a shard whose every sample was skipped is none
        else:
            with naming(shard.path):
                result = shard.finish(self.url)
            save_result(self.partial, shard.path.name, result)
            self.done.written += result.info is not None
        self.done.results.append(result)

    def abort(self) -> None:
        """Remove the temporary files of the shard being written (after a failure)."""
        if self._shard is not None:
            self._shard.abort()


def _loaded(source: Source, item: SourceItem, prepared: Prepared) -> PreparedSample | SampleError:
    """The sample to store: as prepared, or loaded again from the source where it is AsLoaded."""
    if not isinstance(prepared, AsLoaded):
        return prepared
    try:
        sample = source.load(item)
    except SampleError as exc:
        return exc
    return PreparedSample(sample.key, prepared.image_field, sample.image, sample.label, sample.extra)


def convert_in_runs(
    source: Source, items: list[SourceItem], engine: ConversionEngine, options: ConvertOptions, out: Path, partial: Path, url: str | None,
    progress: Callable[[int], None],
) -> tuple[list[Duplicate], WrittenShards, tuple[int, ...] | None]:
    """Write ``items`` into shards under ``out`` (then uploaded to ``url`` if given), dropping their
    near duplicates when ``options.near_threshold`` is set, telling ``progress`` how many items each
    run settled; returns the duplicates in plan order, the shards and, for decoded HDF5, the
    pixels' shape."""
    from fastload.near.search import FirstOccurrences

    runs = [tuple(items[i : i + RUN]) for i in range(0, len(items), RUN)]
    digests = [sources_digest(run) for run in runs]
    threshold = options.near_threshold
    decide = FirstOccurrences(threshold, len(items)) if threshold is not None else None
    log = SignatureLog(partial)
    saved = [log.saved(n, digest) if decide is not None else None for n, digest in enumerate(digests)]
    tasks = [RunTask(source, run, options, sign=decide is not None and saved[n] is None) for n, run in enumerate(runs)]
    duplicates: list[Duplicate] = []
    shards = _ShardStream(out, partial, url, options)
    try:
        for n, (signed, prepared) in in_plan_order(engine.map_unordered(prepare_run, tasks)):
            if signed is not None:
                log.save(n, digests[n], signed)
            signatures = signed if signed is not None else saved[n]
            for offset, (item, sample) in enumerate(zip(runs[n], prepared, strict=True)):
                match = None
                if decide is not None:
                    assert signatures is not None  # near: signed now, or saved by the run before
                    match = decide.check(n * RUN + offset, signatures[offset])
                if match is None:
                    shards.add(item, _loaded(source, item, sample))
                else:
                    duplicates.append(Duplicate(item, items[match[0]], match[1]))
            progress(len(runs[n]))
        shards.close()
    except BaseException:
        shards.abort()
        raise
    remove_unplanned_shards(out, partial, {shard_name(n, options.layout) for n in range(len(shards.done.results))}, url)
    return duplicates, shards.done, shards.decoded_shape
