"""The ``fastload`` command: a thin argparse layer; each subcommand imports what it needs lazily."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

NEAR_THRESHOLD = 12  # bits of 64: benchmarks/bench_near_dupes.py measures recall and false drops by threshold
NEAR_HELP = (
    f"near duplicates differ in at most this many of 64 hash bits, and agree in colour (default {NEAR_THRESHOLD}, 0..24; "
    "docs/cleaning.md: recall and false drops by threshold)"
)

def _add_convert(sub: argparse._SubParsersAction) -> None:
    from fastload.converters.convert_options import ENCODERS
    from fastload.converters.engines import ENGINES
    from fastload.converters.sources import SOURCE_MODULES
    from fastload.formats.shard_formats import WRITTEN_LAYOUTS
    from fastload.media import MEDIA_ROLES

    p = sub.add_parser("convert", help="convert a raw dataset into sharded WebDataset tar or HDF5, or documents into token shards")
    p.add_argument("src", help="the raw dataset (folder or file)")
    p.add_argument("out", help="output folder for shards and index.json, or a URL (s3://bucket/prefix, gs://..., any fsspec URL)")
    p.add_argument("--from", dest="source", required=True, choices=sorted(SOURCE_MODULES))
    p.add_argument("--to", dest="layout", choices=sorted(WRITTEN_LAYOUTS), help="default: wds, or tokens with --tokenizer")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--shard-size", default="256MB", help="target shard size, e.g. 256MB, 1GiB (default 256MB)")
    size.add_argument("--samples-per-shard", type=int, help="samples per shard instead of a size")
    p.add_argument("--shuffle", action="store_true", help="shuffle samples (seeded) before sharding (not documents: token shards keep source order)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=1, help="worker processes; output is identical for any count")
    p.add_argument("--limit", type=int, help="convert only the first N samples (after shuffling; with --tokenizer, documents)")
    p.add_argument(
        "--dedupe", nargs="?", const="exact", choices=["exact", "near"],
        help="drop duplicates, keeping the first: exact (content hash; the default) or near (perceptual signature)",
    )
    p.add_argument("--near-threshold", type=int, default=NEAR_THRESHOLD, metavar="BITS", help=NEAR_HELP)
    p.add_argument("--report", metavar="PNG|HTML", help="with --dedupe: draw the duplicate groups side by side as thumbnails (a PNG, or an HTML page for a path ending .html)")
    p.add_argument("--on-error", choices=["raise", "skip"], default="raise")
    p.add_argument("--reencode-quality", type=int, metavar="Q", help="re-encode images as JPEG of quality Q")
    p.add_argument("--max-size", type=int, metavar="PX", help="shrink images (and videos, re-encoded) so the longer side is at most PX")
    for media in MEDIA_ROLES.values():  # each media role's conversion flags: video's --reencode, audio's --audio-codec...
        for flag, keywords in media.conversion.flags:
            p.add_argument(flag, **keywords)
    p.add_argument("--max-pixels", type=int, help="reject images with more pixels (bombs); default 89478485 (Pillow's), or FASTLOAD_MAX_PIXELS")
    p.add_argument("--follow-symlinks", action="store_true",
                   help="read files that symlinks lead to outside the source root (or a manifest's folders)")
    p.add_argument("--allow-root", action="append", metavar="DIR", default=[],
                   help="manifest: a folder besides the manifest's own that its rows may read from (absolute paths, .. paths); repeatable")
    p.add_argument("--path-column", default="path", help="manifest: column of image paths")
    p.add_argument("--label-column", default="label", help="manifest/parquet/videos: column of labels")
    p.add_argument("--caption-column", default="caption", help="videos or audio manifest: column of captions or transcripts (stored as txt), if present")
    p.add_argument("--image-column", default="image", help="parquet: column of images")
    p.add_argument("--split", default="train", choices=["train", "test"], help="cifar/mnist: which split")
    text = p.add_argument_group("documents into token shards (--from jsonl, text; parquet and wds with --text-field)")
    text.add_argument("--tokenizer", metavar="PATH", help="a local Hugging Face tokenizer.json, or a transformers tokenizer folder")
    text.add_argument("--text-field", help="jsonl: the key of the text (default text); parquet: its column; wds: its member's extension (txt)")
    text.add_argument("--append-eos", action="store_true", help="end every document with the tokenizer's eos token")
    text.add_argument("--bos", action="store_true", help="start every document with the tokenizer's bos token")
    text.add_argument("--bos-token", metavar="TEXT", help="the bos token's text, where the tokenizer's config names none")
    text.add_argument("--eos-token", metavar="TEXT", help="the eos token's text, where the tokenizer's config names none")
    text.add_argument("--allow-special-tokens", action="store_true",
                      help="a special token's text in a document (<|endoftext|>) gets its id; default: encoded as ordinary text")
    text.add_argument("--encoder", choices=ENCODERS, default="auto",
                      help="what encodes the text: tokenizers; fast: fastokens (pip install 'fastload[fast-tokenizer]'), checked to "
                           "give tokenizers' ids on a sample first; auto (default): fast where it loads and agrees, else tokenizers")
    text.add_argument("--min-tokens", type=int, default=1, metavar="N", help="leave out (and count) documents of fewer tokens")
    text.add_argument("--shard-tokens", default="100M", metavar="N", help="tokens a shard holds, about (e.g. 100M, 2G; default 100M)")
    p.add_argument("--hdf5-decoded", action="store_true", help="HDF5: store decoded uint8[N,H,W,C] pixels")
    p.add_argument("--hdf5-compression", choices=["gzip", "lzf"], help="HDF5: compress decoded pixels")
    p.add_argument("--engine", choices=ENGINES, default="local", help="local process pool, or a Ray cluster")
    p.add_argument("--address", help="with --engine ray: 'auto' or ray://HOST:PORT (default: start a local Ray)")
    p.add_argument("--staging", help="with a URL as OUT: local folder for shards awaiting upload (default: in FASTLOAD_CACHE_DIR)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=_run_convert)


def parse_count(text: str, name: str) -> int:
    """A count as people write it: 100M, 2G, 1.5K or 500000 (decimal)."""
    from fastload.converters.convert_options import parse_size

    if text.strip().upper().endswith(("IB", "B")):
        raise ValueError(f"{name}: a count of tokens (e.g. 100M), not a size in bytes")
    return parse_size(text)


def _run_convert(args: argparse.Namespace) -> int:
    from fastload.converters.conversion import convert
    from fastload.converters.convert_options import TOKENS_LAYOUT, ConvertOptions, TokenizeOptions, parse_size
    from fastload.converters.sources import SourceOptions
    from fastload.decode.header import MAX_PIXELS
    from fastload.formats.writing import WriterOptions
    from fastload.media import MEDIA_ROLES

    tokens = None
    if args.tokenizer is not None:
        tokens = TokenizeOptions(
            tokenizer=args.tokenizer, append_eos=args.append_eos, bos=args.bos, min_tokens=args.min_tokens,
            shard_tokens=parse_count(args.shard_tokens, "--shard-tokens"), bos_token=args.bos_token, eos_token=args.eos_token,
            allow_special_tokens=args.allow_special_tokens, encoder=args.encoder,
        )
    options = ConvertOptions(
        source=args.source,
        layout=args.layout or (TOKENS_LAYOUT if tokens is not None else "wds"),
        tokens=tokens,
        shard_bytes=None if args.samples_per_shard else parse_size(args.shard_size),
        samples_per_shard=args.samples_per_shard,
        shuffle=args.shuffle,
        seed=args.seed,
        workers=args.workers,
        limit=args.limit,
        dedupe=args.dedupe == "exact",
        near_threshold=args.near_threshold if args.dedupe == "near" else None,
        on_error=args.on_error,
        reencode_quality=args.reencode_quality,
        max_size=args.max_size,
        **{name: getattr(args, name) for media in MEDIA_ROLES.values() for name in media.conversion.fields},
        max_pixels=MAX_PIXELS if args.max_pixels is None else args.max_pixels,
        source_options=SourceOptions(
            follow_symlinks=args.follow_symlinks,
            allowed_roots=tuple(args.allow_root),
            path_column=args.path_column,
            label_column=args.label_column,
            image_column=args.image_column,
            caption_column=args.caption_column,
            split=args.split,
            text_field=args.text_field,
        ),
        writer_options=WriterOptions(hdf5_decoded=args.hdf5_decoded, hdf5_compression=args.hdf5_compression),
    )
    start = time.perf_counter()
    if args.address and args.engine != "ray":
        raise ValueError("--address is for --engine ray")
    if args.report and not args.dedupe:
        raise ValueError("--report draws the duplicates --dedupe drops: give --dedupe")
    report = convert(
        args.src, args.out, options, engine=args.engine, quiet=args.quiet, address=args.address, staging=args.staging,
        report_png=args.report,
    )
    seconds = time.perf_counter() - start
    index = report.index
    if report.already_complete:
        print(f"{_shown(args.out)}: already converted ({_many(index.num_samples, 'sample')} in {_many(len(index.shards), 'shard')})")
        return 0
    done = f"{_many(report.shards_written, 'shard')} written, {report.shards_reused} resumed"
    if index.tokenizer is not None:
        print(f"{_shown(args.out)}: {_many(index.num_samples, 'document')}, {_many(index.num_tokens, 'token')} ({index.tokenizer.dtype}) in "
              f"{_many(len(index.shards), 'token shard')} in {seconds:.1f}s ({index.num_tokens / max(seconds, 1e-9) / 1e6:.2f}M tokens/s); {done}")
    else:
        print(
            f"{_shown(args.out)}: {_many(index.num_samples, 'sample')} in {_many(len(index.shards), f'{index.layout} shard')}, "
            f"{index.total_bytes / 1e6:.1f} MB in {seconds:.1f}s ({index.total_bytes / 1e6 / max(seconds, 1e-9):.1f} MB/s); {done}"
            + (f" ({report.shards_changed} finished earlier rewritten: their sources changed)" if report.shards_changed else "")
        )
    if index.skipped:
        print(f"skipped {_many(sum(index.skipped.values()), 'bad sample')} {index.skipped}: see {_shown(args.out)}/skipped.jsonl")
    if index.duplicates:
        print(f"dropped {index.duplicates} duplicates: see {_shown(args.out)}/duplicates.jsonl")
    return 0


def _add_index(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("index", help="make a folder of existing WebDataset tars a dataset in place (.idx files, index.json), "
                                     "or index Parquet files read in place")
    p.add_argument("dataset", help="a folder of .tar files (img2dataset's, any WebDataset writer's), or a writable URL "
                                   "holding them (s3://bucket/prefix, gs://...); the tars are not rewritten. Or Parquet files: "
                                   "a folder of them (index.json written beside them), a .parquet file or URL, hf://datasets/ORG/NAME "
                                   "(the index kept in the cache folder, FASTLOAD_CACHE_DIR); docs/in-place.md")
    p.add_argument("--force", action="store_true", help="replace an existing index.json")
    p.add_argument("--scratch", help="for a URL: where each tar is downloaded to be indexed (default: the temp folder)")
    p.add_argument("--workers", type=int, help="for a folder: processes indexing tars at once (default: one per CPU)")
    p.set_defaults(run=_run_index)


def _run_index(args: argparse.Namespace) -> int:
    from fastload.formats.part_table import PartTable
    from fastload.storage.in_place_index import PARTS, index_in_place, locate
    from fastload.storage.remote import is_url, redact

    folder = Path(args.dataset)
    if locate(args.dataset) is not None or (folder.is_dir() and not any(folder.glob("*.tar")) and any(folder.rglob("*.parquet"))):
        index, seconds, kept = index_in_place(args.dataset, force=args.force)
        files = len({entry[0] for entry in index.shards.files}) if isinstance(index.shards, PartTable) else len(index.shards)
        print(f"{redact(args.dataset)}: indexed {index.num_samples} rows in {len(index.shards)} {PARTS[index.layout]} of {files} file(s) in "
              f"{seconds:.1f}s, read in place; columns {', '.join(f'{c} ({r})' for c, r in index.columns.items())}; index in {kept}")
        return 0
    if is_url(args.dataset):
        from fastload.converters.index_remote import index_remote

        if args.workers is not None:
            raise ValueError("--workers is for a folder: a URL's tars are downloaded and indexed two at a time")
        index, seconds = index_remote(args.dataset, force=args.force, scratch=args.scratch)
    else:
        from fastload.converters.index_tars import index_tars

        if args.scratch is not None:
            raise ValueError("--scratch is for a URL: a folder's tars are indexed where they are")
        index, seconds = index_tars(args.dataset, force=args.force, workers=args.workers)
    print(
        f"{redact(args.dataset)}: indexed {index.num_samples} samples in {len(index.shards)} tars, {index.total_bytes / 1e6:.1f} MB "
        f"in {seconds:.1f}s ({index.total_bytes / 1e6 / max(seconds, 1e-9):.1f} MB/s); fields {', '.join(index.fields)}"
    )
    return 0


def _add_inspect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="summarise a converted dataset")
    p.add_argument("dataset", help="a converted dataset folder or its URL")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--clip", default="16:2", metavar="FRAMES[:STRIDE]",
                   help="videos: the clip whose decoding cost is estimated, and what --reencode would save (default 16:2)")
    p.set_defaults(run=_run_inspect)


def _run_inspect(args: argparse.Namespace) -> int:
    from fastload.av.video_role import parse_clip
    from fastload.media import MEDIA_ROLES
    from fastload.storage.summary import summarize

    summary = summarize(args.dataset, parse_clip(args.clip, None).span)
    if args.json:
        print(json.dumps(summary, indent=1, sort_keys=True))
        return 0
    print(f"dataset   {_shown(args.dataset)}")
    print(f"layout    {summary['layout']} (from {summary['source'] or '?'})")
    print(f"samples   {summary['samples']} in {summary['shards']} shards, {summary['bytes'] / 1e6:.1f} MB")
    print(f"fields    {', '.join(summary['fields'])}")
    if summary["tokens"] is not None:
        _print_tokens(summary["tokens"])
    if summary["decoded_shape"]:
        print(f"pixels    {summary['decoded_shape']} uint8 per sample")
    for media in MEDIA_ROLES.values():  # each media role's lines: videos (and a clip's cost), audio
        part = summary[media.summary_key]
        if part and part["count"]:
            print("\n".join(media.report(part, args.clip)))
    if summary["classes"] is not None or summary["class_counts"]:
        _print_classes(summary["class_counts"], summary["classes"], summary["class_balance"])
    print(f"skipped   {summary['skipped_total']} {summary['skipped'] or ''}")
    for entry in summary["skipped_samples"][:20]:
        print(f"  {entry['where']}: {entry['reason']}")
    print(f"duplicates dropped {summary['duplicates']}")
    return 0


def _print_tokens(tokens: dict) -> None:
    """A token dataset's tokenizer, document lengths and most frequent ids."""
    tokenizer = tokens["tokenizer"]
    print(f"tokens    {tokens['tokens']} ({tokenizer['dtype']}), tokenizer {tokenizer['kind']} sha256 {tokenizer['sha256'][:12]}, "
          f"vocabulary {tokenizer['vocab_size']}, bos {tokenizer['bos_id']}, eos {tokenizer['eos_id']}, pad {tokenizer['pad_id']}")
    if "length_histogram" not in tokens:
        return
    quantiles = ", ".join(f"{q} {v}" for q, v in tokens["length_quantiles"].items())
    print(f"lengths   mean {tokens['mean_length']:.1f} tokens a document; {quantiles}")
    largest = max(tokens["length_histogram"].values(), default=1)
    for span, count in tokens["length_histogram"].items():
        print(f"  {span:>15} {count:>9}  {'#' * round(40 * count / largest)}")
    names = {v: k for k, v in tokenizer["special"].items()}
    top = ", ".join(f"{t['id']}{' ' + repr(names[t['id']]) if t['id'] in names else ''} {100 * t['share']:.1f}%" for t in tokens["top_ids"][:10])
    print(f"top ids   {top} (of {tokens['ids_sampled']} sampled)")


def _print_classes(counts: dict[str, int], classes: list[str] | None, balance: dict | None) -> None:
    """The class histogram (largest classes first, 50 at most) and its imbalance."""
    full = {name: counts.get(name, 0) for name in classes or counts}
    print(f"classes   {len(full)}")
    if balance is not None:
        ratio = "inf (a class has no sample)" if balance["max_min_ratio"] is None else f"{balance['max_min_ratio']:.2f}"
        print(
            f"balance   largest/smallest {ratio}; entropy {balance['entropy_bits']:.3f} bits "
            f"({balance['normalized_entropy']:.3f} of the {balance['classes']} classes' maximum)"
        )
    largest = max(full.values(), default=0) or 1
    ranked = sorted(full.items(), key=lambda kv: (-kv[1], kv[0]))
    width = max((len(name) for name, _ in ranked[:50]), default=0)
    for name, count in ranked[:50]:
        print(f"  {name:<{width}} {count:>9}  {'#' * round(40 * count / largest)}")
    if len(ranked) > 50:
        print(f"  ... {len(ranked) - 50} more")


def _add_overlap(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("overlap", help="samples of dataset B that nearly duplicate samples of dataset A (train/val leakage)")
    p.add_argument("a", help="the reference dataset (e.g. train): a converted folder or its URL")
    p.add_argument("b", help="the dataset to check (e.g. validation): a converted folder or its URL")
    p.add_argument("--near-threshold", type=int, default=NEAR_THRESHOLD, metavar="BITS", help=NEAR_HELP)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes decoding (default: one per CPU)")
    p.add_argument("--write-exclude", metavar="FILE", help="write B's overlapping keys, one a line, for the loader's exclude=")
    p.add_argument("--report", metavar="PNG|HTML", help="draw each overlapping group side by side as thumbnails (a PNG, or an HTML page for a path ending .html)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(run=_run_overlap)


def _run_overlap(args: argparse.Namespace) -> int:
    from fastload.near.overlap import draw_overlap, find_overlap, write_exclude

    start = time.perf_counter()
    overlap = find_overlap(args.a, args.b, args.near_threshold, args.workers)
    seconds = time.perf_counter() - start
    if args.write_exclude:
        write_exclude(args.write_exclude, overlap)
    if args.report:
        draw_overlap(args.report, overlap)
    if args.json:
        print(json.dumps(overlap.as_json(), indent=1, sort_keys=True))
        return 0
    print(
        f"{_shown(args.b)}: {len(overlap.matches)} of {overlap.b_samples} samples within {args.near_threshold} bits of one of "
        f"{overlap.a_samples} in {_shown(args.a)} ({seconds:.1f}s)"
    )
    for m in overlap.matches[:20]:
        print(f"  {m.b_key}  ~  {m.a_key}  ({m.distance} bits)")
    if len(overlap.matches) > 20:
        print(f"  ... {len(overlap.matches) - 20} more" + ("" if args.write_exclude else ": --json or --write-exclude lists them all"))
    for name, failed in overlap.unreadable.items():
        for where, reason in failed[:20]:
            print(f"unreadable in {name.upper()}: {where}: {reason}", file=sys.stderr)
    if args.write_exclude:
        print(f"wrote {args.write_exclude}: {len({m.b_key for m in overlap.matches})} keys of B to exclude")
    return 0


def _add_verify(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="check every shard's checksum and sample count")
    p.add_argument("dataset", help="a converted dataset folder or its URL (then every shard is downloaded)")
    p.add_argument("--decode", action="store_true", help="also decode every image")
    p.set_defaults(run=_run_verify)


def _run_verify(args: argparse.Namespace) -> int:
    from fastload.storage.verify import verify_dataset

    report = verify_dataset(args.dataset, decode=args.decode)
    for problem in report.problems:
        print(f"BAD {problem}", file=sys.stderr)
    status = "OK" if report.ok else f"FAILED ({len(report.problems)} problems)"
    print(f"{_shown(args.dataset)}: {report.shards} shards, {report.samples} samples verified{' and decoded' if args.decode else ''}: {status}")
    return 0 if report.ok else 1


def _add_bench(sub: argparse._SubParsersAction) -> None:
    from fastload.bench import BACKENDS, TRANSFORMS

    p = sub.add_parser("bench", help="loaders side by side on the same data; data-stall analysis")
    p.add_argument("dataset", help="a converted dataset")
    p.add_argument("--source", type=Path, help="the raw image folder it came from (for the torch baseline)")
    p.add_argument("--backends", default="fastload-cpu,torch", help=f"comma-separated, from {','.join(BACKENDS)}")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", default="2", help="comma-separated worker counts, e.g. 0,1,2,4")
    p.add_argument("--transform", choices=TRANSFORMS, default="train")
    p.add_argument("--size", type=int, default=224, help="the transform's output side (e.g. 32 for CIFAR-sized images)")
    p.add_argument("--epochs", type=int, default=1, help="epochs per loader per round")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds; medians are reported")
    p.add_argument("--model", choices=["resnet18", "resnet50", "resnet_small", "none"], default="none", help="data-stall analysis")
    p.add_argument("--steps", type=int, default=20, help="training steps for the data-stall analysis")
    p.add_argument("--gpu-price", type=float, metavar="USD_PER_HOUR", help="print time and cost per epoch")
    p.add_argument("--dataset-size", type=int, help="images per epoch for --gpu-price (default: this dataset's)")
    p.add_argument("--json", type=Path, help="write the results as JSON")
    p.add_argument("--plot", type=Path, help="write throughput vs workers as PNG (needs matplotlib)")
    p.set_defaults(run=_run_bench)


def _run_bench(args: argparse.Namespace) -> int:
    from fastload.bench import format_table, run_bench, write_outputs

    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    workers = [int(w) for w in args.workers.split(",")]
    report = run_bench(
        args.dataset, args.source, backends, workers, args.batch_size, args.transform, args.epochs, args.rounds,
        model=None if args.model == "none" else args.model, steps=args.steps, size=args.size,
    )
    size = args.dataset_size
    if args.gpu_price is not None and size is None:
        from fastload.formats.index import read_index

        size = read_index(args.dataset).num_samples
    print(format_table(report, args.gpu_price, size))
    note = write_outputs(report, args.json, args.plot)
    if note:
        print(note)
    return 0


def _add_describe(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("describe", help="which samples, with which crop and flip, a training step's batch held")
    p.add_argument("dataset", help="a converted dataset folder or its URL")
    p.add_argument("--step", type=int, required=True, help="the step within the epoch, from 0")
    p.add_argument("--state", type=Path, help="a saved loader.state_dict() (JSON, or a torch checkpoint holding it under 'loader'): "
                   "seed, epoch, world size, batch size and the topologies it was resumed from come from it")
    p.add_argument("--seed", type=int, help="the loader's seed= (default 0, or the state's)")
    p.add_argument("--epoch", type=int, help="default: 0, or the state's")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world", type=int, help="world size (default 1, or the state's)")
    p.add_argument("--batch-size", type=int, help="per rank (default 1, or the state's)")
    p.add_argument("--no-shuffle", dest="shuffle", action="store_false", help="the loader ran with shuffle=False")
    p.add_argument("--drop-last", action="store_true", help="the loader ran with drop_last=True")
    p.add_argument("--shuffle-buffer", type=int, help="the loader's shuffle_buffer= (streaming order)")
    p.add_argument("--take", type=Path, help="a text file of sample indices, one a line: the loader read a Subset of them")
    p.add_argument("--exclude", type=Path, help="the loader's exclude= file (keys, one a line)")
    p.add_argument("--balanced", action="store_true", help="the loader ran with balanced=True")
    p.add_argument("--class-weights", type=json.loads, metavar="JSON",
                   help='the loader\'s class_weights=, as a JSON object: \'{"cat": 2, "dog": 1}\'')
    p.add_argument("--transform", choices=["train", "val", "none"], default="train", help="fastload.transforms.train/val(SIZE)")
    p.add_argument("--size", type=int, default=224, help="the transform's output side")
    from fastload.media import MEDIA_ROLES

    for media in MEDIA_ROLES.values():  # each media role's sampling: --clip, --audio
        p.add_argument(f"--{media.keyword}", metavar=media.option.metavar, help=media.option.help)
    p.add_argument("--sampling", choices=["random", "uniform", "centred", "start"],
                   help=f"with {' or '.join(f'--{media.keyword}' for media in MEDIA_ROLES.values())}: the sampling (default: random when shuffled)")
    p.add_argument("--seq-len", type=int, help="a token dataset (required for one): the loader's seq_len=")
    p.add_argument("--packing", choices=["concat", "best-fit", "pad"], help="a token dataset: the loader's packing= (default concat)")
    p.add_argument("--block-tokens", type=int, help="a token dataset: the loader's block_tokens= (default 65536)")
    p.add_argument("--packing-window", type=int, help="a token dataset, best-fit: the loader's packing_window=")
    p.add_argument("--field", metavar="COLUMN", help="data read in place, with --seq-len: the column of token ids or text (the loader's fields=[COLUMN])")
    p.add_argument("--tokenizer", help="data read in place, with --seq-len: the loader's tokenizer= (a text column's)")
    p.add_argument("--json", action="store_true", help="print the description as JSON")
    p.set_defaults(run=_run_describe)


def _run_describe(args: argparse.Namespace) -> int:
    from fastload.cli.describe import TokenStepDescription, describe_from_arguments
    from fastload.media import MEDIA_ROLES

    description = describe_from_arguments(args)
    if args.json:
        print(json.dumps(description.as_dict(), indent=1))
        return 0
    print(f"epoch {description.epoch} step {description.step} rank {description.rank} of {description.world_size}, "
          f"batch size {description.batch_size}")
    if isinstance(description, TokenStepDescription):  # a row a line: its segments, as shard:document[first token:end]
        print(f"rows of {description.seq_len} tokens, each a list of shard:document[first:end token in the document]")
        for n, row in enumerate(description.rows):
            spans = ", ".join(f"{s['shard']}:{s['document']}[{s['offset']}:{s['offset'] + s['tokens']}]" for s in row)
            print(f"{n:>5} {spans or '(padding)'}")
        return 0
    for n, s in enumerate(description.samples):
        geometry = "" if s.box is None else (
            f" {s.source_size[0]}x{s.source_size[1]} crop ({s.box[0]:.1f}, {s.box[1]:.1f}, {s.box[2]:.1f}, {s.box[3]:.1f})"  # type: ignore[index]
            f" -> {s.size[0]}x{s.size[1]}{' flipped' if s.flip else ''}{f' at DCT scale {s.dct_scale}' if s.dct_scale else ''}")  # type: ignore[index]
        clips = "".join(media.text(s.described(role)) for role, media in MEDIA_ROLES.items())
        print(f"{n:>5} {s.index:>9} {s.where}{'' if s.valid else ' (padding)'}{clips}{geometry}{f' PROBLEM {s.problem}' if s.problem else ''}")
    return 0


def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="build a small dataset, convert, verify, load and benchmark it")
    p.add_argument("--workdir", default="data/demo", help="where to put the demo data (default data/demo)")
    p.add_argument("--images", type=int, default=600, help="number of images to generate")
    p.set_defaults(run=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    from fastload.cli.demo import run_demo

    return run_demo(args.workdir, args.images, main)


def _many(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless the count is one: "1 shard", "0 shards"."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _shown(location: str) -> str:
    """A dataset's folder or URL as the command prints it: a URL without its credentials."""
    from fastload.storage.remote import redact

    return redact(str(location))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``fastload`` command."""
    parser = argparse.ArgumentParser(prog="fastload", description="Fast data loading for PyTorch training.")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_convert, _add_index, _add_inspect, _add_overlap, _add_verify, _add_describe, _add_bench, _add_demo):
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fastload`` command; returns the exit status."""
    from fastload.errors import FastloadError

    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (FastloadError, ValueError, OSError, RuntimeError, ImportError, LookupError) as exc:  # OSError: disk full, permissions, ...
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc  # a KeyError's str() is its repr
        print(f"fastload {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fastload {args.command}: interrupted", file=sys.stderr)
        return 130

