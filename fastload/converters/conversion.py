"""Execute a conversion: plan, write the missing shards on an engine, then publish the index last.

Resumable: each finished shard leaves a small result file in ``OUT/.fastload-partial/``, which
records what the shard was made from (each source file's size and mtime_ns); a rerun with the same
options keeps those shards whose sources are unchanged and rewrites every other (the plan, hence
every shard's bytes, is a pure function of the input and the options). One run at a time holds OUT
(converters.lock).

OUT may be a URL (``s3://bucket/prefix``, any fsspec URL): shards are then written to a local
staging folder, uploaded as each finishes and deleted locally; the reports and index.json are
uploaded last. The bookkeeping stays in staging, so a rerun on the same machine resumes.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, cast

from fastload._util.files import atomic_write_bytes, fsync_dir, naming, remove_temporaries
from fastload.converters.convert_options import ConvertOptions
from fastload.converters.dedupe import DocumentDuplicates, Duplicate, draw_duplicates, find_duplicate_documents, find_duplicates
from fastload.converters.engines import ConversionEngine, open_engine
from fastload.converters.in_runs import convert_in_runs
from fastload.converters.lock import locked_output
from fastload.converters.partial import (
    PARTIAL_DIR,
    ConversionConflict,
    check_partial,
    finished_result,
    remove_partial,
    save_result,
)
from fastload.converters.plan import ShardPlan, assign_shards, order_items
from fastload.converters.sample import SourceItem
from fastload.converters.shard import ShardResult, ShardTask, WrittenShards, prepare_sample, sources_digest, write_shard
from fastload.converters.sources import Source, TextSource, open_source
from fastload.converters.tokens import (
    TokenShardTask,
    first_documents,
    plan_token_shards,
    tokenizer_identity,
    write_token_shard,
)
from fastload.errors import SampleError
from fastload.formats.index import (
    FORMAT_VERSION,
    INDEX_FILE,
    SKIPPED_REPORT,
    TOKENS_VERSION,
    VIDEO_FORMAT_VERSION,
    DatasetIndex,
    TokenizerIdentity,
    read_index,
    write_index,
)
from fastload.storage import remote
from fastload.text.fast_encoder import share_cores

__all__ = ["PARTIAL_DIR", "ConversionConflict", "ConvertReport", "convert", "staging_dir"]
DUPLICATES_REPORT = "duplicates.jsonl"


@dataclass(frozen=True)
class ConvertReport:
    """What a conversion did, for the command's summary line."""

    index: DatasetIndex
    shards_written: int
    shards_reused: int
    already_complete: bool
    shards_changed: int = 0  # finished by an earlier run, rewritten because their sources changed since


def _json_line(obj: object) -> str:
    return json.dumps(obj, sort_keys=True) + "\n"


def _within(entry: dict, root: str, name: str = "where") -> dict:
    """A report entry with its ``name`` (a place) relative to the source root: the reports travel
    with the dataset (uploaded beside it), this machine's folders need not."""
    where = entry.get(name)
    if isinstance(where, str) and where.startswith(root + "/"):
        return {**entry, name: where[len(root) + 1 :]}
    return entry


def _decoded_shape(source: Source, items: list[SourceItem], options: ConvertOptions) -> tuple[int, ...]:
    """The fixed pixel shape of a decoded HDF5 dataset: that of the first sample that prepares."""
    for item in items:
        try:
            prepared = prepare_sample(source.load(item), options, None)
        except SampleError:
            continue
        image = prepared.image
        if image is not None and not isinstance(image, bytes):  # decoded: an array
            return tuple(image.shape)
    raise ValueError("no readable sample to take the decoded image shape from")


def staging_dir(url: str) -> Path:
    """Where a conversion to ``url`` writes shards before uploading them (in the cache folder)."""
    from fastload.storage.cache import default_cache_dir

    return default_cache_dir() / "staging" / hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]


def _existing_index(out: Path, url: str | None) -> DatasetIndex | None:
    """The finished dataset's index at OUT, if there is one."""
    if url is None:
        return read_index(out) if (out / INDEX_FILE).exists() else None
    from fastload.storage.dataset import read_remote_index

    return read_remote_index(url) if remote.size(remote.join(url, INDEX_FILE)) is not None else None


def _assemble_index(
    source: Source | TextSource, options: ConvertOptions, results: list[ShardResult], duplicates: int,
    decoded_shape: tuple[int, ...] | None, tokenizer: TokenizerIdentity | None = None,
) -> DatasetIndex:
    class_counts: Counter[int] = Counter()
    skipped: Counter[str] = Counter()
    fields: set[str] = set()
    image_fields: set[str] = set()
    for result in results:
        class_counts.update(result.class_counts)
        skipped.update(entry["reason"].split(":")[0].split(" (")[0] for entry in result.skipped)
        if result.filtered:
            skipped[f"fewer than {options.tokens.min_tokens if options.tokens else 0} tokens"] += result.filtered
        fields.update(result.fields)
        image_fields.update(result.image_fields)
    classes = source.classes
    names = classes if classes is not None else None

    def label_name(label: int) -> str:
        return names[label] if names is not None and 0 <= label < len(names) else str(label)

    conversion = _recorded_options(options)
    has_video = any(result.video for result in results)
    version = TOKENS_VERSION if tokenizer is not None else VIDEO_FORMAT_VERSION if has_video else FORMAT_VERSION
    return DatasetIndex(
        version=version,
        layout=options.layout,
        shards=tuple(r.info for r in results if r.info is not None),
        fields=tuple(sorted(fields)),
        classes=tuple(classes) if classes is not None else None,
        class_counts={label_name(k): v for k, v in sorted(class_counts.items())},
        image_fields=tuple(sorted(image_fields)),
        decoded_shape=decoded_shape,
        skipped=dict(sorted(skipped.items())),
        duplicates=duplicates,
        source=options.source,
        conversion=conversion,
        tokenizer=tokenizer,
    )


def _recorded_options(options: ConvertOptions) -> dict[str, Any]:
    """The options index.json records (where the source and the tokenizer were on this machine: not)."""
    conversion = options.fingerprint()
    conversion.pop("source_options")
    if conversion.get("tokens") is not None:
        conversion["tokens"].pop("tokenizer")  # its identity is recorded instead
    return conversion


class _NoProgress:
    """Stands in for the progress bar off a terminal (importing tqdm alone costs ~70 ms)."""

    format_dict: ClassVar[dict[str, float]] = {"elapsed": 1.0}

    def update(self, n: int) -> None:
        """Nothing to show."""

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        """Nothing to show."""

    def __enter__(self) -> _NoProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _progress(total: int, quiet: bool):
    """A tqdm bar (images/s, MB/s, ETA) on a terminal; nothing otherwise."""
    if quiet or not sys.stderr.isatty():
        return _NoProgress()
    from tqdm import tqdm

    tqdm.monitor_interval = 0  # no monitor thread: we fork workers
    return tqdm(total=total, unit="img", smoothing=0.1, dynamic_ncols=True)


def convert(
    src: str, out_dir: str, options: ConvertOptions, engine: str = "local", quiet: bool = False,
    address: str | None = None, staging: str | None = None, report_png: str | None = None,
) -> ConvertReport:
    """Convert the raw dataset at ``src`` into shards and an index under ``out_dir`` (a folder or
    a URL; ``staging`` overrides where shards wait for upload), on the ``engine`` ("local", or
    "ray" at ``address``; then a local OUT must be shared by every node); ``report_png``: draw
    the duplicates dropped there."""
    url = out_dir.rstrip("/") if remote.is_url(out_dir) else None
    out = (Path(staging) if staging else staging_dir(url)).absolute() if url else Path(out_dir).absolute()
    out.mkdir(parents=True, exist_ok=True)
    with locked_output(out):
        report = _convert(src, out, url, options, engine, quiet, address, report_png)
    if url is not None and not any(out.iterdir()):
        out.rmdir()  # staging holds nothing once every shard is uploaded
    return report


def _convert(
    src: str, out: Path, url: str | None, options: ConvertOptions, engine: str, quiet: bool, address: str | None,
    report_png: str | None,
) -> ConvertReport:
    partial = out / PARTIAL_DIR
    fingerprint: dict[str, Any] = {"options": options.fingerprint()}
    existing = _existing_index(out, url) if not partial.exists() else None
    if existing is not None:
        if existing.conversion != _recorded_options(options):
            raise ConversionConflict(f"{remote.redact(url) if url else out} already holds a dataset converted with other options; choose another OUT")
        return ConvertReport(index=existing, shards_written=0, shards_reused=len(existing.shards), already_complete=True)

    remove_temporaries(out)  # of a run that was killed: with OUT locked, none is a live writer's
    source = open_source(options.source, str(Path(src).absolute()), options.source_options)
    runner = open_engine(engine, options.workers, address)
    items = order_items(source.items(), options.shuffle, options.seed, options.limit if options.tokens is None else None)
    text = cast(TextSource, source)
    if options.tokens is not None and options.limit is not None:  # the first N documents (a token conversion's samples), not items
        text, items = first_documents(text, items, options.limit)
    if not items:
        raise ValueError(f"{src}: the source holds no samples")
    tokenizer: TokenizerIdentity | None = None
    dup_lines: list[dict] = []
    with _progress(len(items), quiet) as bar:
        if options.tokens is not None:  # documents into token shards (fastload.converters.tokens)
            if engine == "local" and options.workers > 1:  # the workers, forked later, each encode on their share of the cores
                share_cores(options.workers)
            tokenizer = tokenizer_identity(options.tokens, text, items)
            fingerprint["tokenizer_sha256"], fingerprint["encoder"] = tokenizer.sha256, tokenizer.encoder  # no resume mixes encoders
            found = find_duplicate_documents(text, items, runner) if options.dedupe else DocumentDuplicates({}, [])
            dup_lines = found.lines
            shards = _write_token_shards(text, items, found, tokenizer, runner, options, out, partial, url, fingerprint, bar)
            duplicates: list[Duplicate] = []
            decoded_shape = None
        elif options.near_threshold is not None:  # drops decided while the shards are written
            fingerprint["items_sha256"] = hashlib.sha256("\n".join(item.key for item in items).encode()).hexdigest()
            check_partial(partial, fingerprint)
            duplicates, shards, decoded_shape = convert_in_runs(source, items, runner, options, out, partial, url, bar.update)
        else:
            duplicates = find_duplicates(source, items, runner) if options.dedupe else []
            kept, plans = _plan(items, duplicates, options, partial, fingerprint)
            if _costs_cpu(options):  # spread sample by sample: few shards still keep every worker busy
                bar.update(len(items) - len(kept))
                _, shards, decoded_shape = convert_in_runs(source, kept, runner, options, out, partial, url, bar.update)
            else:
                shards, decoded_shape = _write_planned(source, kept, plans, runner, options, out, partial, url, bar)
        if options.writer_options.hdf5_decoded and decoded_shape is None:
            raise ValueError("no readable sample to take the decoded image shape from")
    if report_png is not None:
        draw_duplicates(report_png, source, duplicates, f"{src}: duplicates dropped")

    remove_temporaries(out)  # of task workers killed mid-shard (their retries used other names)
    ordered = shards.results
    index = _assemble_index(source, options, ordered, len(duplicates) + len(dup_lines), decoded_shape, tokenizer)
    root = str(Path(src).absolute())
    skipped_lines = [_json_line(_within(entry, root)) for r in ordered for entry in r.skipped]
    _write_report(out / SKIPPED_REPORT, skipped_lines)
    dup_lines += [dup.report_line(options.near_threshold is not None) for dup in duplicates]
    _write_report(out / DUPLICATES_REPORT, [_json_line(_within(_within(line, root, "duplicate_of"), root)) for line in dup_lines])
    fsync_dir(out)  # every shard's rename is durable before the index that lists it
    with naming(out / INDEX_FILE):
        write_index(out, index)
    if url is not None:
        _publish(out, url)
        for name in (INDEX_FILE, SKIPPED_REPORT, DUPLICATES_REPORT):
            (out / name).unlink(missing_ok=True)
    remove_partial(partial)
    return ConvertReport(
        index=index, shards_written=shards.written, shards_reused=shards.reused, already_complete=False, shards_changed=shards.changed
    )


def _costs_cpu(options: ConvertOptions) -> bool:
    """Whether preparing a sample re-encodes it (``--reencode-quality``, ``--max-size``, a media role's
    options: fastload.media's ``conversion.reencodes``): then the work is spread sample by sample
    (converters.in_runs), else shard by shard (decoded HDF5 too: its pixels would cross to the writing process)."""
    from fastload.media import MEDIA_ROLES

    return (options.reencode_quality is not None or options.max_size is not None
            or any(media.conversion.reencodes(options) for media in MEDIA_ROLES.values()))


def _plan(
    items: list[SourceItem], duplicates: list[Duplicate], options: ConvertOptions, partial: Path, fingerprint: dict[str, Any]
) -> tuple[list[SourceItem], list[ShardPlan]]:
    """The items not in ``duplicates`` and their shards, the plan recorded in (or checked against)
    the partial folder's fingerprint."""
    if duplicates:
        dropped = {id(dup.item) for dup in duplicates}
        items = [item for item in items if id(item) not in dropped]
    plans = assign_shards(items, options.layout, options.shard_bytes, options.samples_per_shard)
    fingerprint["plan_sha256"] = hashlib.sha256("\n".join(f"{p.name} {i.key}" for p in plans for i in p.items).encode()).hexdigest()
    check_partial(partial, fingerprint)
    return items, plans


def _write_planned(
    source: Source, items: list[SourceItem], plans: list[ShardPlan], runner: ConversionEngine, options: ConvertOptions,
    out: Path, partial: Path, url: str | None, bar,
) -> tuple[WrittenShards, tuple[int, ...] | None]:
    """Write the planned shards a previous run did not finish, a shard a task on the engine's
    workers; returns them and, for decoded HDF5, the pixels' shape."""
    decoded_shape = _decoded_shape(source, items, options) if options.writer_options.hdf5_decoded else None

    results: dict[int, ShardResult] = {}
    shards = WrittenShards()
    for plan in plans:
        result, changed = finished_result(out, partial, plan.name, sources_digest(plan.items), url, decoded_shape)
        shards.changed += changed
        if result is not None:
            results[plan.number] = result
    shards.reused = sum(result.info is not None for result in results.values())  # a plan whose every sample was skipped is no shard
    todo = [plan for plan in plans if plan.number not in results]
    tasks = [ShardTask(source, plan, str(out), options, decoded_shape, upload_to=url) for plan in todo]
    bar.update(sum(len(plans[n].items) for n in results))
    written_bytes = 0
    for position, result in runner.map_unordered(write_shard, tasks):
        results[result.number] = result
        # Bookkeeping only: if a crash loses it, the shard is simply written again. It is
        # written after the shard's data was fsynced, so it never vouches for a lost shard.
        save_result(partial, todo[position].name, result)
        written_bytes += result.info.bytes if result.info else 0
        bar.update(len(todo[position].items))
        bar.set_postfix_str(f"{written_bytes / max(bar.format_dict['elapsed'], 1e-9) / 1e6:.1f} MB/s", refresh=False)
    shards.written = sum(results[plan.number].info is not None for plan in todo)
    shards.results = [results[plan.number] for plan in plans]
    return shards, decoded_shape


def _write_token_shards(
    source: TextSource, items: list[SourceItem], duplicates: DocumentDuplicates, tokenizer: TokenizerIdentity, runner: ConversionEngine,
    options: ConvertOptions, out: Path, partial: Path, url: str | None, fingerprint: dict[str, Any], bar,
) -> WrittenShards:
    """Plan the token shards (recorded in, or checked against, the partial folder), then write those
    a previous run did not finish, a shard a task on the engine's workers."""
    assert options.tokens is not None
    plans = plan_token_shards(source, items, options.tokens, tokenizer)
    fingerprint["plan_sha256"] = hashlib.sha256("\n".join(f"{p.name} {i.key}" for p in plans for i in p.items).encode()).hexdigest()
    check_partial(partial, fingerprint)
    position = {item.key: number for number, item in enumerate(items)}
    results: dict[int, ShardResult] = {}
    shards = WrittenShards()
    for plan in plans:
        result, changed = finished_result(out, partial, plan.name, sources_digest(plan.items), url)
        shards.changed += changed
        if result is not None:
            results[plan.number] = result
    shards.reused = sum(result.info is not None for result in results.values())  # a plan that kept no document is no shard
    todo = [plan for plan in plans if plan.number not in results]
    tasks = [TokenShardTask(source, plan, str(out), options, tokenizer, tuple(duplicates.drops.get(position[i.key], ()) for i in plan.items),
                            upload_to=url) for plan in todo]
    bar.update(sum(len(plans[n].items) for n in results))
    for at, result in runner.map_unordered(write_token_shard, tasks):
        results[result.number] = result
        save_result(partial, todo[at].name, result)  # bookkeeping, after the shard's data is durable
        bar.update(len(todo[at].items))
    shards.written = sum(results[plan.number].info is not None for plan in todo)
    shards.results = [results[plan.number] for plan in plans]
    return shards


def _publish(staging: Path, url: str) -> None:
    """Upload the reports (removing stale ones) and, last, index.json from staging to ``url``."""
    for name in (SKIPPED_REPORT, DUPLICATES_REPORT):
        if (staging / name).exists():
            remote.upload(staging / name, remote.join(url, name))
        else:
            remote.remove(remote.join(url, name))
    remote.upload(staging / INDEX_FILE, remote.join(url, INDEX_FILE))


def _write_report(path: Path, lines: list[str]) -> None:
    """Write a JSON-lines report, or remove a stale one when there is nothing to report."""
    if lines:
        with naming(path):
            atomic_write_bytes(path, "".join(lines).encode())
    else:
        path.unlink(missing_ok=True)

