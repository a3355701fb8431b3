"""DALI's webdataset index (``.idx``), version v1.2: the per-sample byte offsets beside each tar
shard, written by the converters in the same pass as the tar and read by fastload's tar reader
and by DALI's ``fn.readers.webdataset`` (as ``index_paths``).

First line "v1.2 N"; then one line per sample listing, for each of its tar members,
"ext data_offset size member_name".
"""

from __future__ import annotations

import re

import numpy as np

from fastload.errors import DatasetIndexError
from fastload.formats.columns import PackedStrings, int_column

DALI_INDEX_VERSION = "v1.2"

Member = tuple[str, int, int, str]  # (ext, data offset, size, member name)


def format_dali_index(samples: list[list[Member]]) -> bytes:
    """Render a DALI v1.2 index for a tar shard from each sample's member list."""
    lines = [f"{DALI_INDEX_VERSION} {len(samples)}"]
    for members in samples:
        lines.append(" ".join(f"{ext} {off} {size} {name}" for ext, off, size, name in members))
    return ("\n".join(lines) + "\n").encode()


class TarMembers:
    """A tar shard's parsed ``.idx``, kept compact: every sample's key and each field's
    (data offset, size) in a few flat arrays (~70 bytes a sample where per-sample Python dicts and
    tuples took ~600: 0.8 GB in every worker process for ImageNet's 1.28M samples)."""

    def __init__(self, keys: list[str], first: np.ndarray, exts: list[str], ext_ids: np.ndarray, offsets: np.ndarray, sizes: np.ndarray) -> None:
        """``ext_ids`` (uint16) index ``exts``; ``first``, ``offsets`` and ``sizes`` are int64."""
        self._keys = PackedStrings(keys)
        self._first = int_column(first)  # sample i's members are first[i]:first[i + 1]
        self._exts, self._ext_ids = exts, int_column(ext_ids, "H")
        self._offsets, self._sizes = int_column(offsets), int_column(sizes)

    def __len__(self) -> int:
        return len(self._first) - 1

    def key(self, i: int) -> str:
        """The key of sample ``i``."""
        return self._keys[i]

    def spans(self, i: int) -> dict[str, tuple[int, int]]:
        """Each field of sample ``i``: {ext: (data offset, size)}."""
        members = slice(self._first[i], self._first[i + 1])
        exts = self._exts
        return {exts[e]: (offset, size) for e, offset, size in zip(self._ext_ids[members], self._offsets[members], self._sizes[members])}

    def members(self) -> list[tuple[str, int, int]]:
        """Every member as (name, data offset, size), in .idx order."""
        exts, ext_ids = self._exts, self._ext_ids
        counts: np.ndarray = np.diff(np.frombuffer(self._first, dtype=np.int64))
        owners = np.repeat(np.arange(len(self)), counts).tolist()
        return [
            (self.key(owner) + (f".{exts[ext_ids[m]]}" if exts[ext_ids[m]] else ""), self._offsets[m], self._sizes[m])
            for m, owner in enumerate(owners)
        ]


IDX_WHITESPACE = re.compile(r"\s")  # what str.isspace calls whitespace: the .idx format splits on it, so no key or field holds any
_DALI_HEADER = re.compile(rf"{re.escape(DALI_INDEX_VERSION)} +([0-9]{{1,18}}) *")


def parse_dali_index(text: str, where: str) -> TarMembers:
    """Parse a DALI v1.2 index (one sample a line, four tokens a member) into :class:`TarMembers`;
    a DatasetIndexError names ``where`` and the line, never what the file holds."""
    head, _, body = text.partition("\n")
    if not head.strip():
        raise DatasetIndexError(f"{where}: empty DALI index")
    header = _DALI_HEADER.fullmatch(head.strip())
    if header is None:
        raise DatasetIndexError(f"{where}: expected a '{DALI_INDEX_VERSION} N' header on the first line")
    lines = body.splitlines()
    tokens_per_line = np.fromiter(map(len, map(str.split, lines)), np.int64, len(lines))
    malformed = np.flatnonzero((tokens_per_line == 0) | (tokens_per_line % 4 != 0))
    if malformed.size:
        raise DatasetIndexError(f"{where}:{int(malformed[0]) + 2}: malformed sample line")
    if len(lines) != int(header[1]):
        raise DatasetIndexError(f"{where}: header says {int(header[1])} samples, found {len(lines)}")
    tokens = body.split()
    first = np.zeros(len(lines) + 1, np.int64)
    np.cumsum(tokens_per_line // 4, out=first[1:])
    names = tokens[3::4]
    keys = [split_member_name(names[m])[0] for m in first[:-1].tolist()]
    ext_tokens = tokens[0::4]
    exts = list(dict.fromkeys(ext_tokens))
    if len(exts) > np.iinfo(np.uint16).max:
        raise DatasetIndexError(f"{where}: more than {np.iinfo(np.uint16).max} different field names")
    ext_ids = np.fromiter(map({ext: e for e, ext in enumerate(exts)}.__getitem__, ext_tokens), np.uint16, len(ext_tokens))
    try:
        offsets, sizes = (np.fromiter(map(int, tokens[k::4]), np.int64, len(ext_tokens)) for k in (1, 2))
    except ValueError:
        raise DatasetIndexError(f"{where}: a member's offset or size is not an integer") from None
    except OverflowError:
        raise DatasetIndexError(f"{where}: a member's offset or size is beyond the int64 range") from None
    return TarMembers(keys, first, exts, ext_ids, offsets, sizes)


def split_member_name(name: str) -> tuple[str, str]:
    """Split a tar member name into (key, ext) at the first dot of its last path part, as WebDataset."""
    dot = name.find(".", name.rfind("/") + 1)
    if dot < 0:
        return name, ""
    return name[:dot], name[dot + 1 :]
