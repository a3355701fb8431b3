"""Seeded fuzzing of every parser of untrusted bytes (#17, #33, #38): a fixed number of cases a
target, each checked, whatever the machine's speed (about 46 CPU seconds in all, so under a minute
on an idle 2-core machine; 8 minutes on a 2-core machine loaded by other processes and two busy
loops, where it passes as well: time limits only catch hangs).

The stored datasets' readers, from small datasets: mutated tar shards, ``.idx`` files, sample
tables, ``index.json`` files and HDF5 layouts (links and storage pointing outside, retyped and
reshaped columns, gigabytes declared in a few bytes), each dataset opened, read sample by sample,
loaded (skipping and raising) and verified through the public API; token shards (ids, document
tables, index.json) loaded in each packing, no id at or beyond the vocabulary delivered; video
shards (the videos, the stream facts of their sample tables) loaded as clips; foreign tars (bit
flips, cuts, crafted sizes and pax records) through ``fastload index``, ``convert --from wds`` and
the header parser itself; ``.npy`` headers and JSON fields through their codecs.

The sources ``fastload convert`` reads, each converted raising and skipping through the command:
JSON Lines compressed in each codec ``--from jsonl`` reads (``.gz``, ``.zst``; it lists no
``.bz2`` or ``.xz``), their streams or their lines mutated, into token shards; a Parquet text
column (``--from parquet --text-field``), its bytes or footer mutated or the column retyped;
tokenizer folders with their tokenizer.json or tokenizer_config.json mutated (as JSON trees or as
bytes); a short video of each container ``--from videos`` takes (mp4, m4v, mov, mkv, webm, avi,
ogv; MPEG program and elementary streams where fastload.fields lists them), mutated, its converted
dataset loaded as clips.

Each group of targets runs in one child process capped by RLIMIT_AS (memory bounded), each case
under a generous time bound (only a hang reaches it). A case must end in fastload errors that are
one line naming the file, or in counted skips (every sample a skipping loader did not deliver is in
its skip record; a damaged source's loss in skipped.jsonl), never another exception, a hang, or
wrong data (a parse that succeeds agrees with the bytes: tar members inside the file and, before
the damage, as written; an array of exactly the bytes its header promises; no message repeating
what an outside file or a document holds; a converted dataset that verifies).

FASTLOAD_FUZZ_SEED picks another seed (the default one is what CI runs)."""

from __future__ import annotations

import bz2
import copy
import functools
import gzip
import hashlib
import io
import json
import lzma
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest

import fastload
from fastload import transforms as T
from fastload.converters import ConvertOptions, convert
from fastload.errors import FastloadError, SampleError
from fastload.fields import decode_field
from fastload.formats.index import INDEX_FILE
from tests.conftest import REPO_ROOT, jpeg_bytes, small_photo

SEED = int(os.environ.get("FASTLOAD_FUZZ_SEED", "1717"))
# Cases per target, a fixed number whatever the machine's speed (each target's seconds on an idle 2-core machine in the comment)
CASES = {"tar": 500, "idx": 500, "index": 500, "table": 400, "hdf5": 300, "foreign-tar": 400, "npy": 20000, "json": 10000,
         "tokens": 40, "video": 180,
         "jsonl": 120, "parquet": 120, "tokenizer": 120, "video-container": 96}
# The targets each child process runs: the stored datasets' readers, and the sources conversion reads
GROUPS = {"stored": ["tar", "idx", "index", "table", "hdf5", "foreign-tar", "npy", "json", "tokens", "video"],
          "sources": ["jsonl", "parquet", "tokenizer", "video-container"]}
CASE_SECONDS = 60  # far above a case's ~30-300 ms, on a busy machine too: only a hang reaches it
GROUP_SECONDS = 1200  # a group's child process, likewise (about 40 s idle, 400 s seen on a loaded machine): only a hang in C code, where no signal is handled, reaches it
MEMORY_BYTES = 3 << 30
SENTINEL = "fastload-fuzz-outside-secret"  # held by files outside every dataset: no message or sample may hold it
OUTSIDE_BYTES = 1 << 16  # the size of those files: more than any column of the base datasets
pytestmark = pytest.mark.timeout(2700)  # above both groups' GROUP_SECONDS: only a hang reaches it


class Hang(Exception):
    """A case ran past CASE_SECONDS."""


@contextmanager
def time_bound(seconds: float) -> Iterator[None]:
    def expire(signum: int, frame: object) -> None:
        raise Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def exercise(root: Path, **loading: object) -> list[str]:
    """What a user does with a dataset: open it, read every sample, load it (skipping, then
    raising; ``loading``: more loader arguments, a video's ``clip=``), verify it with decoding.
    Only fastload errors are expected, and caught; returns what is wrong beyond them: an error on
    several lines or naming no file of the dataset, a sample a skipping loader neither delivered
    nor counted as skipped."""
    messages: list[str] = []
    wrong: list[str] = []
    try:
        ds = fastload.open(root)
    except FastloadError as exc:
        messages.append(str(exc))
        ds = None
    keys: list[str] = []
    for i in range(len(ds) if ds is not None else 0):
        try:
            keys.append(ds.key_of(i))  # type: ignore[union-attr]
            sample = ds[i]  # type: ignore[index]
        except FastloadError as exc:
            messages.append(str(exc))
            continue
        if any(isinstance(value, bytes) and SENTINEL[:6].encode() in value for value in sample.values()):
            wrong.append(f"sample {i} holds bytes of a file outside the dataset")
    for on_error in ("skip", "raise"):
        delivered: list[str] = []
        try:
            with fastload.DataLoader(root, batch_size=2, transform=T.val(16), num_workers=0, on_error=on_error, return_keys=True,
                                     **loading) as loader:
                for batch in loader:
                    delivered += batch["key"] if isinstance(batch, dict) else batch[-1]  # unlabelled: a dict
        except FastloadError as exc:
            messages.append(str(exc))
            continue
        if on_error == "skip" and len(keys) == len(ds or ()):
            counted = {entry["where"].rsplit(":", 1)[-1] for entry in loader.stats.skipped.entries}
            silent = set(keys) - set(delivered) - counted
            if silent:
                wrong.append(f"samples neither delivered nor counted as skipped: {sorted(silent)[:3]}")
    return wrong + verified_and_said(root, messages)


def verified_and_said(root: Path, messages: list[str]) -> list[str]:
    """Verify ``root`` (decoding); every message, those given and verify's, must be one line naming
    a file of the dataset and repeat nothing an outside file holds: those that are not."""
    try:
        messages = messages + fastload.verify_dataset(root, decode=True).problems
    except FastloadError as exc:
        messages = [*messages, str(exc)]
    names = [str(root), *(p.name for p in root.iterdir()), *index_strings(root)]
    return [f"message not one line naming a file of the dataset (or repeating an outside file): {message[:300]!r}"
            for message in messages if "\n" in message or not any(name in message for name in names) or SENTINEL in message]


def exercise_tokens(root: Path, vocab: int) -> list[str]:
    """A token dataset loaded in each packing (0 workers: every batch of an epoch) and verified.
    Only fastload errors are expected; wrong beyond them: a delivered id at or beyond the base's
    vocabulary of ``vocab`` (in ``input_ids``, or in ``labels`` other than the ignore index)."""
    messages: list[str] = []
    wrong: list[str] = []
    try:
        dataset = fastload.open(root)
    except FastloadError as exc:
        return verified_and_said(root, [str(exc)])
    for packing in ("concat", "best-fit", "pad"):
        try:
            with fastload.DataLoader(dataset, batch_size=2, seq_len=24, packing=packing, packing_window=256, block_tokens=128) as loader:
                for batch in loader:
                    ids, labels = batch["input_ids"], batch["labels"]
                    if int(ids.max()) >= vocab or int(ids.min()) < 0 or bool(((labels >= vocab) | ((labels < 0) & (labels != -100))).any()):
                        wrong.append(f"{packing}: an id outside the vocabulary of {vocab} delivered")
                        break
        except FastloadError as exc:
            messages.append(str(exc))
    return wrong + verified_and_said(root, messages)


def index_strings(root: Path) -> list[str]:
    """The strings index.json holds (the files it names, present or not), if it parses."""
    try:
        data = json.loads((root / INDEX_FILE).read_bytes())
    except (OSError, ValueError):
        return []
    strings, nodes = [], [data]
    while nodes:
        node = nodes.pop()
        if isinstance(node, str) and node:
            strings.append(node)
        elif isinstance(node, (list, dict)):
            nodes += list(node.values()) if isinstance(node, dict) else node
    return strings


# --- mutations ----------------------------------------------------------------------------------

def mutate_bytes(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Flipped bits, a truncation, a zeroed or randomised block, or garbage appended."""
    out = bytearray(data)
    kind = rng.choice(["flip", "flip", "truncate", "zero-block", "random-range", "append", "empty"])
    if kind == "flip" and out:
        for _ in range(rng.randint(1, 8)):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        del out[rng.randrange(len(out) + 1) :]
    elif kind == "zero-block" and len(out) >= 512:
        start = rng.randrange(len(out) // 512) * 512
        out[start : start + 512] = bytes(512)
    elif kind == "random-range" and out:
        start = rng.randrange(len(out))
        end = min(len(out), start + rng.randint(1, 64))
        out[start:end] = rng.randbytes(end - start)
    elif kind == "append":
        out += rng.randbytes(rng.randint(1, 2048))
    elif kind == "empty":
        out = bytearray()
    return bytes(out), kind


TOKENS = ["-1", "0", "-512", str(2**31), str(2**62), str(2**63), str(2**70), "abc", "1.5", "9" * 30, "jpg", "../x", "\x00", "１"]


def mutate_idx(text: str, rng: random.Random) -> tuple[str, str]:
    """A DALI .idx with lines swapped, dropped or doubled, a token garbled, or its header miscounted."""
    lines = text.splitlines()
    kind = rng.choice(["swap", "drop", "double", "token", "token", "token", "header", "garbage-line"])
    body = range(1, len(lines))
    if kind == "swap" and len(lines) > 2:
        a, b = rng.sample(body, 2)
        lines[a], lines[b] = lines[b], lines[a]
    elif kind == "drop" and len(lines) > 1:
        del lines[rng.choice(body)]
    elif kind == "double" and len(lines) > 1:
        line = rng.choice(body)
        lines.insert(line, lines[line])
    elif kind == "token" and len(lines) > 1:
        line = rng.choice(body)
        tokens = lines[line].split()
        tokens[rng.randrange(len(tokens))] = rng.choice(TOKENS)
        lines[line] = " ".join(tokens)
    elif kind == "header":
        lines[0] = rng.choice(["v1.2 -1", "v1.2 0", f"v1.2 {len(lines)}", f"v1.2 {len(lines) - 2}", "v1.2", "v1.1 3", "v1.2 99999999999999999999"])
    elif kind == "garbage-line":
        lines.insert(rng.randint(1, len(lines)), " ".join(rng.choice(TOKENS) for _ in range(rng.choice([3, 4, 8]))))
    return "\n".join(lines) + "\n", kind


VALUES = [True, False, None, 0, -1, 10.5, 2**64, "", "x", "../x", "/proc/self/environ", "a" * 64, [], {}, [1], {"a": 1}, ["jpg"], [32, 32, 3]]


def json_paths(node: object, path: tuple = ()) -> Iterator[tuple]:
    """Every (key or index) path in a JSON tree."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield (*path, key)
        yield from json_paths(child, (*path, key))


def mutate_index(data: dict, rng: random.Random) -> tuple[dict, str]:
    """index.json with a value retyped or replaced, a field dropped or added, shard fields swapped,
    or a shard doubled."""
    data = copy.deepcopy(data)
    paths = list(json_paths(data))
    kind = rng.choice(["retype", "retype", "retype", "drop", "add", "swap", "double-shard"])
    path = rng.choice(paths)
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    if kind == "retype":
        parent[path[-1]] = copy.deepcopy(rng.choice(VALUES))
    elif kind == "drop":
        del parent[path[-1]]
    elif kind == "add":
        data[rng.choice(["extra", "num_samples", "decoded_shape", "version"])] = copy.deepcopy(rng.choice(VALUES))
    elif kind == "swap" and len(data["shards"]) > 1:
        field = rng.choice(sorted(data["shards"][0]))
        a, b = data["shards"][0], data["shards"][1]
        a[field], b[field] = b[field], a[field]
    elif kind == "double-shard":
        data["shards"].append(copy.deepcopy(rng.choice(data["shards"])))
    return data, f"{kind} {'/'.join(map(str, path))}"


NUMBERS = [0, 1, 7, 2**31, 2**40, 2**62, 2**64 - 1]


def mutate_table(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """A sample table with a header count (samples, fields, names or keys bytes) set to a hostile
    number, a row's key span or a field's span garbled, or its bytes mutated."""
    out = bytearray(data)
    kind = rng.choice(["header", "header", "row", "row", "bytes"])
    if kind == "header":
        at = rng.choice([8, 16, 24, 32])
        out[at : at + 8] = rng.choice(NUMBERS).to_bytes(8, "little")
    elif kind == "row":
        names = int.from_bytes(out[24:32], "little")
        fields = int.from_bytes(out[16:24], "little")
        rows = int.from_bytes(out[8:16], "little")
        row = 64 + names + rng.randrange(max(rows, 1)) * (2 + 2 * fields) * 8
        at = row + 8 * rng.randrange(2 + 2 * fields)
        value = rng.choice([-2, -1, *NUMBERS])
        out[at : at + 8] = value.to_bytes(8, "little", signed=value < 0)
    else:
        return mutate_bytes(data, rng)
    return bytes(out), kind


def mutate_hdf5(path: Path, rng: random.Random, outside: Path) -> str:
    """One hostile change to an HDF5 shard's layout: a column deleted, retyped or reshaped, reached
    by a soft or external link, stored in an outside file or mapped from one, declared gigabytes
    in a few bytes, or its offsets or present flags garbled."""
    import h5py

    with h5py.File(path, "r+") as f:
        columns: list[str] = []
        f.visit(columns.append)
        name = rng.choice(columns)
        kind = rng.choice(["delete", "retype", "link", "external", "virtual", "declare", "declare", "offsets", "present", "dataset-for-group"])
        parent, _, leaf = name.rpartition("/")
        group = f[parent] if parent else f
        if kind == "offsets":
            offsets = [n for n in columns if n.endswith("offsets")]
            if offsets:
                name = rng.choice(offsets)
                values = f[name][:]
                values[rng.randrange(len(values))] = rng.choice([-5, 2**40, 2**62, 0])
                f[name][:] = values
            return f"offsets of {name}"
        if kind == "present":
            target = rng.choice([n for n in columns if n.startswith("extra/") and n.count("/") == 1] or ["image"])
            if f[target].__class__.__name__ == "Group":
                if "present" in f[target]:
                    del f[target]["present"]
                f[target].create_dataset("present", data=np.array(rng.choice([[1] * 3, [2] * 99, [0] * 99]), np.int64))
            return f"present of {target}"
        if kind in ("external", "virtual"):  # a byte column's bytes, of the size its offsets expect, from outside
            name = rng.choice([n for n in columns if n.endswith("/bytes")])
            parent, _, leaf = name.rpartition("/")
            group = f[parent]
        size = f[name].shape[0] if kind in ("external", "virtual") else 0
        del group[leaf]
        rows = 6
        if kind == "retype":
            shape = rng.choice([(rows,), (rows - 1,), (rows, 2), (0,), (rows + 1, 3)])
            dtype = rng.choice([np.float32, np.int64, np.uint8, "S3", h5py.string_dtype(), h5py.vlen_dtype(np.uint8)])
            group.create_dataset(leaf, shape=shape, dtype=dtype)
        elif kind == "link":
            group[leaf] = rng.choice([h5py.SoftLink("/" + rng.choice(columns)), h5py.ExternalLink(str(outside / "outside.h5"), "secret"),
                                      h5py.SoftLink("/nothing")])
        elif kind == "external":
            group.create_dataset(leaf, shape=(size,), dtype=np.uint8, external=[(str(outside / "outside.bin"), 0, size)])
        elif kind == "virtual":
            layout = h5py.VirtualLayout(shape=(size,), dtype=np.uint8)
            layout[:] = h5py.VirtualSource(str(outside / "outside.h5"), "secret", shape=(OUTSIDE_BYTES,))[:size]
            group.create_virtual_dataset(leaf, layout)
        elif kind == "declare":  # gigabytes in a few bytes: a compressed fill value, nothing written
            size = rng.choice([2**30, 2**33])
            shape = (size,) if not leaf.startswith("pixels") else (rows, 20000, 20000, 3)
            chunks = rng.choice([(min(size, 2**30),), (1 << 20,)]) if len(shape) == 1 else (1, 1024, 1024, 3)
            group.create_dataset(leaf, shape=shape, dtype=np.uint8, chunks=chunks, compression="gzip", fillvalue=0)
        else:  # a dataset of many rows where a group of columns was
            group.create_dataset(leaf, shape=(10**6,), dtype=np.uint8, chunks=(4096,), compression="gzip", fillvalue=1)
    return f"{kind} {name}"


def with_matching_index(root: Path, shard: str, field: str, checksum: str) -> None:
    """Make index.json agree with a shard file changed in place (its size and sha256, as a
    publisher would), so that verify reaches its contents."""
    index = json.loads((root / INDEX_FILE).read_text())
    for entry in index["shards"]:
        if entry.get(field) == shard:
            data = (root / shard).read_bytes()
            entry[checksum] = hashlib.sha256(data).hexdigest()
            if field == "path":
                entry["bytes"] = len(data)
    (root / INDEX_FILE).write_text(json.dumps(index))


def make_case(bases: dict[str, Path], target: str, number: int, where: Path, seed: int = SEED) -> str:
    """Copy a base dataset to ``where`` and mutate one of its files (case ``number`` of ``seed``); describe what was done."""
    rng = random.Random(f"{seed}-{target}-{number}")
    layout = target if target in ("tokens", "video") else "hdf5" if target == "hdf5" or (target == "index" and number % 4 == 0) else "wds"
    shutil.copytree(bases[layout], where)
    index = json.loads((where / INDEX_FILE).read_text())
    shard = rng.choice(index["shards"])
    if target in ("tokens", "video"):  # the shard's data (ids, or the videos' tar), its table (documents, or facts), or index.json
        field, checksum = rng.choice([("path", "sha256"), ("table", "table_sha256"), ("table", "table_sha256"), (INDEX_FILE, "")])
        if field == INDEX_FILE:
            mutated, kind = mutate_index(index, rng)
            (where / INDEX_FILE).write_text(json.dumps(mutated))
            return f"{kind} of {target} {INDEX_FILE}"
        path = where / shard[field]
        data, kind = mutate_table(path.read_bytes(), rng) if field == "table" and target == "video" else mutate_bytes(path.read_bytes(), rng)
        path.write_bytes(data)
        if rng.random() < 0.5:  # as a publisher would: the index agreeing with the changed file
            with_matching_index(where, shard[field], field, checksum)
        return f"{kind} of {shard[field]}"
    if target == "tar":
        path = where / shard["path"]
        data, kind = mutate_bytes(path.read_bytes(), rng)
        path.write_bytes(data)
        return f"{kind} of {shard['path']}"
    if target == "idx":
        path = where / shard["offsets"]
        if rng.random() < 0.25:
            data, kind = mutate_bytes(path.read_bytes(), rng)
            path.write_bytes(data)
        else:
            text, kind = mutate_idx(path.read_text(), rng)
            path.write_text(text)
        return f"{kind} of {shard['offsets']}"
    if target == "table":
        path = where / shard["table"]
        data, kind = mutate_table(path.read_bytes(), rng)
        path.write_bytes(data)
        with_matching_index(where, shard["table"], "table", "table_sha256")
        return f"{kind} of {shard['table']}"
    if target == "hdf5":
        kind = mutate_hdf5(where / shard["path"], rng, bases["outside"])
        with_matching_index(where, shard["path"], "path", "sha256")
        return f"{kind} of {shard['path']}"
    if rng.random() < 0.2:
        data, kind = mutate_bytes((where / INDEX_FILE).read_bytes(), rng)
        (where / INDEX_FILE).write_bytes(data)
        return f"{kind} of {layout} {INDEX_FILE}"
    mutated, kind = mutate_index(index, rng)
    (where / INDEX_FILE).write_text(json.dumps(mutated))
    return f"{kind} of {layout} {INDEX_FILE}"


# --- foreign tars: fastload index, convert --from wds and the header parser ----------------------

SIZE_FIELDS = [b"-0000001000\0", b"+0000001000\0", b"\xff" * 12, b"\x80" + (2**62).to_bytes(11, "big"), b"99999999999\0", b"7777777777 \0", b"00000000000\0"]
PAX_LENGTHS = [b"0", b"-5", b"+9", b"1_0", b" 9", b"99999", b"3", b"x"]


def foreign_tar(rng: random.Random) -> bytes:
    """A WebDataset-style tar written by tarfile (trusted here): 3 to 6 samples of jpg, cls and a
    caption, pax or GNU format, some members with pax records."""
    fmt = rng.choice([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for i in range(rng.randint(3, 6)):
            for ext, data in (("jpg", jpegs()[i % 6]), ("cls", str(i % 3).encode()), ("txt", f"caption {i}".encode())):
                info = tarfile.TarInfo(f"s{i:03d}.{ext}")
                info.size = len(data)
                if fmt == tarfile.PAX_FORMAT and rng.random() < 0.5:
                    info.pax_headers = {"comment": "x" * rng.randint(0, 40)}
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def header_starts(data: bytes) -> list[int]:
    """Where each header block of a valid tar starts (tarfile's own listing, extended headers too)."""
    starts = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar:
            starts.append(member.offset)
    return starts


def mutate_tar_headers(data: bytes, rng: random.Random) -> tuple[bytes, str, int]:
    """A tar with one header's size set to a crafted value (its checksum fixed: only the size is
    wrong), a pax record's length garbled, a cut at a block boundary, or bytes mutated; and the
    first byte the change touched."""
    out = bytearray(data)
    kind = rng.choice(["size", "size", "pax-length", "pax-length", "cut", "bytes"])
    starts = header_starts(data)
    if kind == "size":
        at = rng.choice(starts)
        out[at + 124 : at + 136] = rng.choice(SIZE_FIELDS)
        out[at + 148 : at + 156] = b" " * 8
        out[at + 148 : at + 156] = b"%06o\0 " % sum(out[at : at + 512])
        return bytes(out), kind, at
    if kind == "pax-length":
        records = [i for i in range(len(out)) if out[i : i + 9] == b" comment="]
        if records:
            end = rng.choice(records)
            start = out.rindex(b"\n", 0, end) + 1 if b"\n" in out[end - 8 : end] else end - len(str(int(out[end - 2 : end]))) if out[end - 2 : end].isdigit() else end - 1
            out[start:end] = rng.choice(PAX_LENGTHS)
            return bytes(out), kind, start // 512 * 512
        kind = "cut"
    if kind == "cut":
        at = rng.choice(starts)
        return bytes(out[:at]), kind, at
    mutated, how = mutate_bytes(data, rng)
    first = next((i for i, (a, b) in enumerate(zip(mutated, data)) if a != b), min(len(mutated), len(data)))
    return mutated, f"bytes {how}", first // 512 * 512


def check_foreign_tar(data: bytes, original: bytes, touched: int, folder: Path) -> list[str]:
    """Index, convert (raising, then skipping) and parse one mutated tar; what went wrong."""
    from fastload.converters.index_tars import index_tars
    from fastload.formats.tar_headers import TarDamage, tar_members

    wrong: list[str] = []
    tar = folder / "tars" / "part.tar"
    tar.parent.mkdir(parents=True)
    tar.write_bytes(data)
    before = [m for m in tar_members(memoryview(original), "o") if m[2] + m[3] <= touched]  # entirely before the change
    try:
        got = tar_members(memoryview(data), str(tar))
        damaged = False
        if any(offset < 512 or offset + size > len(data) for _, _, offset, size in got):
            wrong.append("a member outside the file")
    except TarDamage as exc:
        got, damaged = exc.members, True
        if not str(exc).startswith(f"{tar}: not a readable tar (") or "\n" in str(exc):
            wrong.append(f"damage message {str(exc)[:200]!r}")
    if [m[1:] for m in got[: len(before)]] != [m[1:] for m in before][: len(got)]:
        wrong.append("members before the change read differently")
    for attempt in (lambda: index_tars(tar.parent, workers=1), lambda: convert(str(tar), str(folder / "raise"), ConvertOptions(source="wds"), quiet=True)):
        try:
            attempt()
        except (FastloadError, ValueError, OSError) as exc:
            if str(tar) not in str(exc) or "\n" in str(exc):
                wrong.append(f"an error not naming the tar in one line: {str(exc)[:200]!r}")
    convert(str(tar), str(folder / "skip"), ConvertOptions(source="wds", on_error="skip"), quiet=True)
    report = folder / "skip" / "skipped.jsonl"
    if damaged and not (report.exists() and str(tar) in report.read_text()):
        wrong.append("a damaged tar converted with --on-error skip and no loss reported")
    return wrong


# --- codecs: .npy headers and JSON fields ---------------------------------------------------------

DESCRS = ["<f4", "|u1", "<i8", ">f8", "|V0", "<U0", "|S0", "|V8", "(2,3)<f4", "<c16", "|b1", "O", "<M8[s]", "[('a','<i4')]", "<f2", "x", "<U2"]


def npy_case(rng: random.Random) -> bytes:
    """A .npy whose header says a random dtype, shape and order, followed by a random number of bytes."""
    shape = tuple(rng.choice([0, 1, 3, -1, 2**31, 2**62, 2**64]) for _ in range(rng.choice([0, 1, 2, 3, 65])))
    header = repr({"descr": rng.choice(DESCRS), "fortran_order": rng.random() < 0.3, "shape": shape}).encode()
    header += b" " * (-(10 + len(header) + 1) % 64) + b"\n"
    version = rng.choice([b"\x01\x00", b"\x02\x00", b"\x03\x00", b"\x09\x09"])
    length = len(header).to_bytes(2 if version == b"\x01\x00" else 4, "little")
    data = b"\x93NUMPY" + version + length + header + rng.randbytes(rng.choice([0, 1, 4, 8, 12, 24, 48]))
    return mutate_bytes(data, rng)[0] if rng.random() < 0.3 else data


def check_npy(data: bytes) -> list[str]:
    try:
        array = decode_field("array", data, "s.tar:k", "npy")
    except SampleError as exc:
        return [] if exc.where == "s.tar:k" and exc.reason.startswith("field npy: ") and "\n" not in str(exc) else [f"message {str(exc)[:200]!r}"]
    if array.nbytes and array.nbytes > len(data):
        return [f"an array of {array.nbytes} bytes from {len(data)}"]
    return []


def json_case(rng: random.Random) -> bytes:
    """A JSON document, valid or mutated, sometimes nested deep."""
    depth = rng.choice([1, 10, 500, 5000, 100000])
    doc = json.dumps({"i": rng.randint(0, 9), "caption": "a photo ✓", "boxes": [[1, 2, 3, 4]]}).encode()
    if rng.random() < 0.3:
        doc = b"[" * depth + b"1" + b"]" * depth
    return mutate_bytes(doc, rng)[0] if rng.random() < 0.5 else doc


def check_json(data: bytes) -> list[str]:
    try:
        decode_field("json", data, "s.tar:k", "json")
    except SampleError as exc:
        leaked = len(data) > 12 and data[:12].decode("utf-8", "replace") in str(exc)
        return [f"message {str(exc)[:200]!r}"] if "\n" in str(exc) or leaked else []
    return []


# --- converted sources: compressed JSON Lines, Parquet text, tokenizer files, video containers ----

def zstd_compress(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor().compress(data)


COMPRESSORS: dict[str, Callable[[bytes], bytes]] = {".gz": gzip.compress, ".zst": zstd_compress, ".bz2": bz2.compress, ".xz": lzma.compress}
# a video file of each extension --from videos may take, as (codec, FFmpeg muxer) tests/video/media.py writes it: the
# targets fuzz those fastload.fields.VIDEO_FIELDS lists (MPEG program and elementary streams where it lists them)
CONTAINERS = {"mp4": ("libx264", "mp4"), "m4v": ("libx264", "ipod"), "mov": ("libx264", "mov"), "mkv": ("libx264", "matroska"),
              "webm": ("libvpx-vp9", "webm"), "avi": ("mpeg4", "avi"), "ogv": ("libvpx", "ogg"), "mpg": ("mpeg1video", "mpeg"),
              "mpeg": ("mpeg2video", "mpeg"), "mpv": ("mpeg2video", "mpeg2video"), "m1v": ("mpeg1video", "mpeg1video"),
              "m2v": ("mpeg2video", "mpeg2video")}
SOURCE_TEXTS = 8  # documents in the JSON Lines and Parquet bases


def jsonl_codecs() -> list[str]:
    """The compressed suffixes ``--from jsonl`` reads (``.gz``, ``.zst``, ...), from its own list."""
    from fastload.converters.sources.jsonl import SUFFIXES

    return sorted({suffix[suffix.rindex("."):] for suffix in SUFFIXES if suffix.startswith(".jsonl.")})


def video_extensions() -> list[str]:
    """The video files' extensions ``--from videos`` takes (fastload.fields.VIDEO_FIELDS), each of which CONTAINERS makes."""
    from fastload.fields import VIDEO_FIELDS

    return sorted(VIDEO_FIELDS)


def cli(args: list[str]) -> tuple[int, str]:
    """``fastload ARGS`` run in this process: its exit status and what it wrote to stderr."""
    from fastload.cli.command import main

    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        status = main(args)
    return status, err.getvalue()


def check_convert(source: Path, options: list[str], folder: Path, names: list[str]) -> tuple[list[str], list[Path]]:
    """``fastload convert SOURCE`` with ``options``, raising then skipping: each must finish, or
    exit 2 with one line of error naming one of ``names`` (the mutated file, its folder) and
    repeating no document; a conversion the raising run stopped and the skipping run finished must
    report the loss (skipped.jsonl naming the file). What went wrong, and the datasets written."""
    wrong: list[str] = []
    written: list[Path] = []
    for on_error in ("raise", "skip"):
        out = folder / f"out-{on_error}"
        status, err = cli(["convert", str(source), str(out), *options, "--on-error", on_error, "--quiet"])
        if status == 0:
            written.append(out)
            continue
        if status != 2 or err.count("\n") != 1 or not any(name in err for name in names) or SENTINEL in err:
            wrong.append(f"{on_error}: exit status {status}, an error not one line naming the file: {err[:300]!r}")
    report = folder / "out-skip" / "skipped.jsonl"  # its places: as the source names them (a path, or one relative to a folder)
    if written == [folder / "out-skip"] and not (report.exists() and any(Path(name).name in report.read_text() for name in names)):
        wrong.append("a conversion that stopped when raising finished when skipping with no loss reported")
    for out in written:
        problems = fastload.verify_dataset(out).problems
        wrong += [f"the converted dataset does not verify: {problem[:200]}" for problem in problems]
    return wrong, written


def mutate_tree(data: object, rng: random.Random) -> tuple[object, str]:
    """A JSON tree with one value retyped or replaced, or one key dropped or added."""
    data = copy.deepcopy(data)
    paths = list(json_paths(data))
    kind = rng.choice(["retype", "retype", "drop", "add"]) if paths else "add"
    path = rng.choice(paths) if paths else ()
    parent = data
    for key in path[:-1]:
        parent = parent[key]  # type: ignore[index]
    if kind == "retype":
        parent[path[-1]] = copy.deepcopy(rng.choice(VALUES))  # type: ignore[index]
    elif kind == "drop":
        del parent[path[-1]]  # type: ignore[attr-defined]
    elif isinstance(data, dict):
        data[rng.choice(["extra", "bos_token", "eos_token", "model", "added_tokens", "normalizer", "pre_tokenizer", "vocab"])] = copy.deepcopy(rng.choice(VALUES))
    return data, f"{kind} {'/'.join(map(str, path))}"


def jsonl_case(bases: dict[str, Path], number: int, rng: random.Random, where: Path) -> tuple[str, list[str], Path, list[str]]:
    """A compressed JSON Lines file of each codec --from jsonl reads in turn: its stream mutated, or a valid
    stream of mutated lines; (what was done, the convert options, the file, the names an error may give)."""
    suffix = jsonl_codecs()[number % len(jsonl_codecs())]
    text = (bases["sources"] / "docs.jsonl").read_bytes()
    path = where / f"docs.jsonl{suffix}"
    where.mkdir(parents=True)
    if rng.random() < 0.6:
        data, kind = mutate_bytes(COMPRESSORS[suffix](text), rng)
        kind = f"{kind} of the {suffix} stream"
    else:
        mutated, kind = mutate_bytes(text, rng)
        data, kind = COMPRESSORS[suffix](mutated), f"{kind} of the lines in {suffix}"
    path.write_bytes(data)
    return kind, ["--from", "jsonl", "--tokenizer", str(bases["sources"] / "tokenizer.json"), "--append-eos"], path, [str(path)]


PARQUET_TYPES = ["int64", "binary", "list", "struct", "null", "large_string", "dictionary", "nulls", "empty"]


def parquet_case(bases: dict[str, Path], number: int, rng: random.Random, where: Path) -> tuple[str, list[str], Path, list[str]]:
    """A Parquet file of documents in a text column (three row groups): its bytes or its footer
    mutated, or the column written as another type."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    where.mkdir(parents=True)
    path = where / "docs.parquet"
    base = (bases["sources"] / "docs.parquet").read_bytes()
    kind = rng.choice(["bytes", "bytes", "footer", "footer", "retype"])
    if kind == "bytes":
        data, how = mutate_bytes(base, rng)
        path.write_bytes(data)
        kind = f"{how} of the file"
    elif kind == "footer":  # the metadata (thrift) and its length, where the reader starts
        out = bytearray(base)
        for _ in range(rng.randint(1, 6)):
            out[len(out) - 1 - rng.randrange(min(len(out), 400))] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(out))
        kind = "footer flips"
    else:
        texts = pq.read_table(bases["sources"] / "docs.parquet").column("text").to_pylist()
        kind = rng.choice(PARQUET_TYPES)
        column = {
            "int64": lambda: pa.array(range(len(texts)), pa.int64()),
            "binary": lambda: pa.array([t.encode() if i % 2 else b"\xff\xfe" + t.encode() for i, t in enumerate(texts)], pa.binary()),
            "list": lambda: pa.array([[t, t] for t in texts]),
            "struct": lambda: pa.array([{"text": t} for t in texts]),
            "null": lambda: pa.nulls(len(texts)),
            "large_string": lambda: pa.array(texts, pa.large_string()),
            "dictionary": lambda: pa.array(texts).dictionary_encode(),
            "nulls": lambda: pa.array([t if i % 3 else None for i, t in enumerate(texts)]),
            "empty": lambda: pa.array(["" for _ in texts]),
        }[kind]()
        pq.write_table(pa.table({"text": column, "id": pa.array(range(len(texts)))}), path, row_group_size=3)
        kind = f"retype {kind}"
    return kind, ["--from", "parquet", "--text-field", "text", "--tokenizer", str(bases["sources"] / "tokenizer.json")], path, [str(path)]


def tokenizer_case(bases: dict[str, Path], number: int, rng: random.Random, where: Path) -> tuple[str, list[str], Path, list[str]]:
    """A tokenizer folder (tokenizer.json and tokenizer_config.json) with one of its files' JSON
    tree or bytes mutated, given as the folder or as its tokenizer.json."""
    folder = where / "tokenizer"
    shutil.copytree(bases["sources"] / "tokenizer", folder)
    name = rng.choice(["tokenizer.json", "tokenizer.json", "tokenizer_config.json"])
    file = folder / name
    if rng.random() < 0.6:
        tree, kind = mutate_tree(json.loads(file.read_text()), rng)
        file.write_text(json.dumps(tree))
    else:
        data, kind = mutate_bytes(file.read_bytes(), rng)
        file.write_bytes(data)
    given = folder if name == "tokenizer_config.json" or rng.random() < 0.5 else file
    options = ["--from", "jsonl", "--tokenizer", str(given), "--append-eos", *(["--bos"] if rng.random() < 0.3 else [])]
    return f"{kind} of {name}", options, bases["sources"] / "docs.jsonl", [str(folder)]


def video_container_case(bases: dict[str, Path], number: int, rng: random.Random, where: Path) -> tuple[str, list[str], Path, list[str]]:
    """A folder of two videos of one container (each --from videos takes, in turn): one mutated, one intact."""
    ext = video_extensions()[number % len(video_extensions())]
    base = (bases["sources"] / "videos" / f"v.{ext}").read_bytes()
    data, kind = mutate_bytes(base, rng)
    for label, name, content in (("c0", f"bad.{ext}", data), ("c1", f"good.{ext}", base)):
        (where / "videos" / label).mkdir(parents=True)
        (where / "videos" / label / name).write_bytes(content)
    path = where / "videos" / "c0" / f"bad.{ext}"
    return f"{kind} of .{ext}", ["--from", "videos", "--samples-per-shard", "2"], where / "videos", [str(path)]


SOURCE_CASES = {"jsonl": jsonl_case, "parquet": parquet_case, "tokenizer": tokenizer_case, "video-container": video_container_case}


def source_bases(folder: Path) -> dict[str, Path]:
    """What the converted-source targets mutate: documents (one holding the sentinel) as JSON Lines
    and as a Parquet text column in three row groups, the small BPE alone and in a folder with a
    tokenizer_config.json, and a short video of each container."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.text.conftest import real_paragraphs, write_jsonl
    from tests.video.media import video

    texts = [*real_paragraphs(SOURCE_TEXTS - 1), f"a document naming {SENTINEL}"]
    small_tokenizer(folder / "tokenizer" / "tokenizer.json", real_paragraphs(120))
    shutil.copy(folder / "tokenizer" / "tokenizer.json", folder / "tokenizer.json")
    (folder / "tokenizer" / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|endoftext|>", "eos_token": {"content": "<|endoftext|>", "special": True}, "pad_token": None,
         "model_max_length": 1024, "tokenizer_class": "PreTrainedTokenizerFast"}))
    write_jsonl(folder / "docs.jsonl", texts)
    pq.write_table(pa.table({"text": texts, "id": list(range(len(texts)))}), folder / "docs.parquet", row_group_size=3)
    (folder / "videos").mkdir()
    for seed, ext in enumerate(video_extensions()):
        codec, muxer = CONTAINERS[ext]
        (folder / "videos" / f"v.{ext}").write_bytes(video(seed, 12, 64, 48, codec=codec, container=muxer, gop=4))
    return {"sources": folder}


# --- the child process: every target, in bounded memory and time ------------------------------------

@functools.cache
def jpegs() -> tuple[bytes, ...]:
    """Six small JPEGs (two classes' worth), made once."""
    return tuple(jpeg_bytes(small_photo(i, i % 2, (20 + i, 24))) for i in range(6))


def base_datasets(folder: Path) -> dict[str, Path]:
    """Six small JPEGs in two classes converted to tar (2 shards) and to HDF5 (1 shard, with text
    and JSON columns), and files outside them holding the sentinel."""
    images = folder / "images"
    for i in range(6):
        path = images / f"class{i % 2}" / f"img{i}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(jpegs()[i])
    convert(str(images), str(folder / "wds"), ConvertOptions(source="imagefolder", samples_per_shard=3), quiet=True)
    fielded = folder / "fielded"
    fielded.mkdir()
    with tarfile.open(fielded / "a.tar", "w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(6):
            for ext, data in (("jpg", jpegs()[i]), ("cls", str(i % 2).encode()), ("txt", f"caption {i}".encode()), ("json", b'{"i": %d}' % i)):
                info = tarfile.TarInfo(f"k{i}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    convert(str(fielded / "a.tar"), str(folder / "hdf5"), ConvertOptions(source="wds", layout="hdf5", samples_per_shard=6), quiet=True)
    outside = folder / "outside"
    outside.mkdir()
    secret = (SENTINEL.encode() * OUTSIDE_BYTES)[:OUTSIDE_BYTES]
    (outside / "outside.bin").write_bytes(secret)
    import h5py

    with h5py.File(outside / "outside.h5", "w") as f:
        f.create_dataset("secret", data=np.frombuffer(secret, np.uint8))
    return {"wds": folder / "wds", "hdf5": folder / "hdf5", "outside": outside, "tokens": token_dataset(folder), "video": video_dataset(folder)}


TOKEN_VOCAB = 300  # the base token dataset's tokenizer: byte-level BPE, 256 bytes and a few merges


def small_tokenizer(path: Path, texts: list[str]) -> Path:
    """A byte-level BPE of TOKEN_VOCAB ids (``<|endoftext|>`` special) trained on ``texts``, saved at ``path``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer, tokenizer.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=TOKEN_VOCAB, special_tokens=["<|endoftext|>"], show_progress=False,
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return path


def token_dataset(folder: Path) -> Path:
    """Real paragraphs (licenses, Python sources) with eos, tokenized by a small BPE trained on
    them, in three token shards."""
    from fastload.converters.convert_options import TokenizeOptions
    from tests.text.conftest import real_paragraphs, write_jsonl

    texts = real_paragraphs(120)
    small_tokenizer(folder / "tokenizer.json", texts)
    write_jsonl(folder / "docs.jsonl", texts)
    convert(str(folder / "docs.jsonl"), str(folder / "tokens"), ConvertOptions(
        source="jsonl", layout="tokens", tokens=TokenizeOptions(str(folder / "tokenizer.json"), append_eos=True, shard_tokens=6000)), quiet=True)
    assert json.loads((folder / "tokens" / INDEX_FILE).read_text())["tokenizer"]["vocab_size"] == TOKEN_VOCAB
    return folder / "tokens"


def video_dataset(folder: Path) -> Path:
    """Four short H.264 videos of a camera moving over the real photos (keyframes every 4 frames),
    two a shard, with their stream facts in the sample tables."""
    from tests.video.media import video_folder

    video_folder(folder / "videos", count=4, frames=(12, 16), gop=4)
    convert(str(folder / "videos"), str(folder / "video"), ConvertOptions(source="videos", samples_per_shard=2), quiet=True)
    return folder / "video"


def run_target(target: str, bases: dict[str, Path], scratch: Path) -> dict:
    """Run ``target``'s CASES[target] cases, each under CASE_SECONDS; its failures and mutation kinds."""
    failures: list[str] = []
    kinds: set[str] = set()
    start, ran = time.perf_counter(), 0
    for number in range(CASES[target]):
        rng = random.Random(f"{SEED}-{target}-{number}")
        where = scratch / f"{target}-{number}"
        try:
            with time_bound(CASE_SECONDS):
                if target == "npy":
                    what, wrong = "npy header", check_npy(npy_case(rng))
                elif target == "json":
                    what, wrong = "json field", check_json(json_case(rng))
                elif target == "foreign-tar":
                    original = foreign_tar(rng)
                    data, what, touched = mutate_tar_headers(original, rng)
                    wrong = check_foreign_tar(data, original, touched, where)
                elif target in SOURCE_CASES:
                    what, options, source, names = SOURCE_CASES[target](bases, number, rng, where)
                    wrong, written = check_convert(source, options, where, names)
                    if target == "video-container":
                        wrong += [problem for out in written for problem in exercise(out, clip=fastload.Clip(4, stride=2))]
                else:
                    what = make_case(bases, target, number, where)
                    wrong = (exercise_tokens(where, TOKEN_VOCAB) if target == "tokens" else
                             exercise(where, clip=fastload.Clip(4, stride=2)) if target == "video" else exercise(where))
            kinds.add(what.split()[0])
            failures += [f"case {number} ({what}): {problem}" for problem in wrong]
        except BaseException as exc:  # a Rust panic (tokenizers, pyarrow) is a BaseException: a failure, not the end
            if isinstance(exc, KeyboardInterrupt):
                raise
            failures.append(f"case {number}: {''.join(traceback.format_exception(exc)[-3:])}")
        shutil.rmtree(where, ignore_errors=True)
        ran += 1
    return {"failures": failures, "kinds": sorted(kinds), "cases": ran, "seconds": time.perf_counter() - start}


def run_group(group: str) -> None:
    """The child's work: build the group's base datasets, run its targets, print the results as one JSON line."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    with tempfile.TemporaryDirectory(prefix="fastload-fuzz-") as tmp:
        if group == "stored":
            bases = base_datasets(Path(tmp) / "bases")
            fastload.verify_dataset(bases["wds"], decode=True)  # first use (imports, decoder set-up) outside the cases
        else:
            bases = source_bases(Path(tmp) / "bases")
        print(json.dumps({target: run_target(target, bases, Path(tmp)) for target in GROUPS[group]}))


@pytest.fixture(scope="module")
def results() -> dict:
    """Each group's targets run in a child process of its own; a group whose child failed: its targets' ``crashed``."""
    got: dict = {}
    for group, targets in GROUPS.items():
        proc = subprocess.run([sys.executable, "-c", f"from tests.test_fuzz_readers import run_group; run_group({group!r})"], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=GROUP_SECONDS)
        if proc.returncode == 0:
            got.update(json.loads(proc.stdout.strip().splitlines()[-1]))
        else:
            got.update({target: {"crashed": f"exit status {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"} for target in targets})
    return got




@pytest.mark.parametrize("target", sorted(CASES))
def test_mutated_inputs_end_in_one_line_errors_or_counted_skips(results: dict, target: str) -> None:
    got = results[target]
    assert "crashed" not in got, got.get("crashed")
    assert not got["failures"], f"seed {SEED}, {len(got['failures'])} of {got['cases']} cases:\n" + "\n".join(got["failures"][:5])
    assert got["cases"] == CASES[target], got  # every case ran: a fixed number, whatever the machine's speed
    assert len(got["kinds"]) >= (1 if target in ("npy", "json") else 4), got["kinds"]  # varied mutations, not one repeated


# (seed, target, case): cases that found a bug (each fixed), run whatever seed the fuzzing has
FOUND = [(1717, "video", 123), (1717, "video", 173), (1, "video", 40), (1, "video", 171), (3, "video", 45)]


def test_the_cases_that_found_bugs_end_in_one_line_errors(tmp_path: Path) -> None:
    """A seek a damaged stream fails, a frame FFmpeg cannot convert, a video dataset's index
    listing no video: each once escaped as av's or Python's own exception."""
    bases = base_datasets(tmp_path / "bases")
    for seed, target, number in FOUND:
        where = tmp_path / f"{seed}-{target}-{number}"
        what = make_case(bases, target, number, where, seed)
        with time_bound(CASE_SECONDS):
            wrong = exercise(where, clip=fastload.Clip(4, stride=2))
        assert not wrong, (seed, number, what, wrong)


def test_every_compression_and_container_is_fuzzed() -> None:
    """The fuzzing follows what fastload reads: each compressed JSON Lines suffix, each video container."""
    assert set(jsonl_codecs()) <= set(COMPRESSORS) and jsonl_codecs()
    assert set(video_extensions()) <= set(CONTAINERS)


def test_a_hang_is_caught_by_the_time_bound() -> None:
    """The time bound the cases run under works: a loop that never ends is stopped."""
    with pytest.raises(Hang), time_bound(0.2):
        while True:
            pass


def test_mutations_change_what_they_say(tmp_path: Path) -> None:
    """The mutators are no no-ops: a mutated case differs from its base."""
    rng = random.Random(1)
    original = foreign_tar(rng)
    assert mutate_tar_headers(original, rng)[0] != original
    data = b"x" * 4096
    assert sum(mutate_bytes(data, random.Random(n))[0] != data for n in range(20)) >= 15
    table: Callable[[random.Random], tuple[bytes, str]] = lambda r: mutate_table(bytes(range(256)) * 4, r)  # noqa: E731
    assert sum(table(random.Random(n))[0] != bytes(range(256)) * 4 for n in range(20)) >= 15
