"""Seeded fuzzing of what a reader trusts (#17): a few hundred mutated tars, ``.idx`` files and
``index.json`` files, built from a small converted dataset (bit flips, truncations, garbled
tokens, swapped and retyped fields), each opened, read sample by sample, loaded (skipping and
raising) and verified through the public API. Every case must end within its time bound, and
every failure must be a ``fastload.FastloadError``.

FASTLOAD_FUZZ_SEED picks another seed (the default one is what CI runs)."""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import signal
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import fastload
from fastload import transforms as T
from fastload.converters import ConvertOptions, convert
from fastload.errors import FastloadError
from fastload.formats.index import INDEX_FILE
from tests.conftest import jpeg_bytes, small_photo

SEED = int(os.environ.get("FASTLOAD_FUZZ_SEED", "1717"))
CASES = {"tar": 200, "idx": 200, "index": 200}
CASE_SECONDS = 10  # far above a case's ~30 ms: only a hang reaches it
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Six small JPEGs in two classes, converted to tar (2 shards) and to HDF5 (1 shard)."""
    images = tmp_path_factory.mktemp("fuzz-images")
    for i in range(6):
        path = images / f"class{i % 2}" / f"img{i}.jpg"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(jpeg_bytes(small_photo(i, i % 2, (20 + i, 24))))
    out = tmp_path_factory.mktemp("fuzz-datasets")
    convert(str(images), str(out / "wds"), ConvertOptions(source="imagefolder", samples_per_shard=3))
    convert(str(images), str(out / "hdf5"), ConvertOptions(source="imagefolder", layout="hdf5", samples_per_shard=6))
    return {"wds": out / "wds", "hdf5": out / "hdf5"}


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


def exercise(root: Path) -> None:
    """What a user does with a dataset: open it, read every sample, load it (skipping, then
    raising), verify it with decoding. Only fastload errors are expected, and caught."""
    try:
        ds = fastload.open(root)
    except FastloadError:
        ds = None
    for i in range(len(ds) if ds is not None else 0):
        try:
            ds[i]  # type: ignore[index]
        except FastloadError:
            pass
    for on_error in ("skip", "raise"):
        try:
            with fastload.DataLoader(root, batch_size=2, transform=T.val(16), num_workers=0, on_error=on_error) as loader:
                for _ in loader:
                    pass
        except FastloadError:
            pass
    try:
        fastload.verify_dataset(root, decode=True)
    except FastloadError:
        pass


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


def make_case(tiny: dict[str, Path], target: str, number: int, where: Path) -> str:
    """Copy a base dataset to ``where`` and mutate one of its files; describe what was done."""
    rng = random.Random(f"{SEED}-{target}-{number}")
    layout = "hdf5" if target == "index" and number % 4 == 0 else "wds"
    shutil.copytree(tiny[layout], where)
    index = json.loads((where / INDEX_FILE).read_text())
    shard = rng.choice(index["shards"])
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
    if rng.random() < 0.2:
        data, kind = mutate_bytes((where / INDEX_FILE).read_bytes(), rng)
        (where / INDEX_FILE).write_bytes(data)
        return f"{kind} of {layout} {INDEX_FILE}"
    mutated, kind = mutate_index(index, rng)
    (where / INDEX_FILE).write_text(json.dumps(mutated))
    return f"{kind} of {layout} {INDEX_FILE}"


@pytest.mark.parametrize("target", sorted(CASES))
def test_mutated_files_end_in_fastload_errors_only(tiny: dict[str, Path], tmp_path: Path, target: str) -> None:
    exercise(tiny["wds"])  # first use (imports, decoder set-up) outside the time bounds
    failures: list[str] = []
    kinds: set[str] = set()
    for number in range(CASES[target]):
        where = tmp_path / f"case-{number}"
        what = make_case(tiny, target, number, where)
        kinds.add(what.split()[0])
        try:
            with time_bound(CASE_SECONDS):
                exercise(where)
        except Exception as exc:
            failures.append(f"case {number} ({what}): {''.join(traceback.format_exception(exc)[-3:])}")
        shutil.rmtree(where)
    assert not failures, f"seed {SEED}, {len(failures)} of {CASES[target]} cases:\n" + "\n".join(failures[:5])
    assert len(kinds) >= 5, kinds  # the mutations are varied, not one kind repeated
