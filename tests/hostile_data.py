"""Test data a careless or hostile publisher could ship: tar datasets holding exactly the bytes
given (no cleaning), tars built header by header (crafted sizes and pax records), JPEGs whose frame
header lies about their size, seeded byte mutations, and a runner for code that must not be able
to take the machine's memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fastload.formats.index import DatasetIndex, write_index
from fastload.formats.wds.writer import WdsShardWriter
from fastload.formats.writing import PreparedSample

REPO = Path(__file__).resolve().parents[1]
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def write_raw_dataset(root: Path, samples: Sequence[tuple[str, str, bytes, int]], per_shard: int = 8) -> Path:
    """A tar dataset of these (key, image field, bytes, label) samples, written as they are."""
    root.mkdir(parents=True, exist_ok=True)
    shards = []
    for number, start in enumerate(range(0, len(samples), per_shard)):
        writer = WdsShardWriter(root / f"shard-{number:05d}.tar")
        for key, ext, data, label in samples[start : start + per_shard]:
            writer.add(PreparedSample(key=key, image_field=ext, image=data, label=label))
        shards.append(writer.finish())
    image_fields = tuple(sorted({ext for _, ext, _, _ in samples}))
    write_index(root, DatasetIndex(layout="wds", shards=tuple(shards), fields=tuple(sorted({*image_fields, "cls"})), image_fields=image_fields))
    return root


def tar_header(name: str, size: int, kind: bytes = b"0", size_field: bytes | None = None) -> bytes:
    """A ustar header of a member ``name`` of ``size`` bytes (checksum filled in); ``size_field``:
    the 12 bytes of its size field exactly as given instead (a crafted size)."""
    header = bytearray(512)
    header[: len(name.encode())] = name.encode()
    header[100:124] = b"0000644\x000000000\x000000000\x00"
    header[124:136] = size_field if size_field is not None else b"%011o\x00" % size
    header[136:148] = b"00000000000\x00"
    header[156:157] = kind
    header[257:265] = b"ustar\x0000"
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\x00 " % sum(header)
    return bytes(header)


def tar_member(name: str, data: bytes, kind: bytes = b"0") -> bytes:
    """One member: its header, its data, padding to the next 512-byte block."""
    return tar_header(name, len(data), kind) + data + bytes(-len(data) % 512)


def pax_member(records: bytes) -> bytes:
    """A pax extended header (type ``x``) holding ``records`` exactly as given."""
    return tar_member("PaxHeaders/0", records, b"x")


def tar_of(*members: bytes) -> bytes:
    """Members followed by the end-of-archive blocks."""
    return b"".join(members) + bytes(1024)


def fake_png_header(width: int, height: int) -> bytes:
    """A small, well-formed PNG that claims huge dimensions (a decompression bomb's header)."""
    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])

    def chunk(kind: bytes, data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def with_frame_size(jpeg: bytes, width: int, height: int) -> bytes:
    """The JPEG with its SOF header claiming ``width`` x ``height`` (everything else unchanged)."""
    i = 2
    while jpeg[i + 1] not in _SOF:
        i += 2 + int.from_bytes(jpeg[i + 2 : i + 4], "big")
    return jpeg[: i + 5] + height.to_bytes(2, "big") + width.to_bytes(2, "big") + jpeg[i + 9 :]


def mutate(data: bytes, rng: np.random.Generator, keep: int = 2) -> bytes:
    """One seeded random damage past the first ``keep`` bytes: bit flips, a cut, an insertion,
    a truncation, or a overwritten run."""
    out = bytearray(data)
    where = int(rng.integers(keep, len(out)))
    kind = int(rng.integers(0, 5))
    if kind == 0:
        for _ in range(int(rng.integers(1, 6))):
            out[int(rng.integers(keep, len(out)))] ^= 1 << int(rng.integers(0, 8))
    elif kind == 1:
        del out[where : where + int(rng.integers(1, 64))]
    elif kind == 2:
        out[where:where] = rng.integers(0, 256, int(rng.integers(1, 32)), dtype=np.uint8).tobytes()
    elif kind == 3:
        del out[where:]
    else:
        run = int(rng.integers(1, 16))
        out[where : where + run] = bytes([int(rng.integers(0, 256))]) * len(out[where : where + run])
    return bytes(out)


PEAK_RSS = """
def peak_rss():
    # This process's peak resident bytes since it started (VmHWM): ru_maxrss keeps the peak of
    # the process it was forked from (pytest's, a few hundred MB), hiding any peak below it.
    with open("/proc/self/status") as status:
        return int(status.read().split("VmHWM:")[1].split()[0]) * 1024
"""


def run_limited(script: str, memory_bytes: int = 3 << 30, timeout: float = 120, env: dict | None = None) -> dict:
    """Run ``script`` in a fresh Python whose address space is capped (RLIMIT_AS, inherited by
    its workers), from the repository root; it must print one JSON line last, returned parsed.
    A crash (signal) or a hang fails the calling test with the output."""
    prelude = f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({memory_bytes}, {memory_bytes}))\n"
    proc = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(script)], cwd=REPO, capture_output=True, text=True,
        timeout=timeout, env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, f"exit status {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])
