"""Existing WebDataset tar shards, for resharding or converting to HDF5; or, with ``--text-field``,
the documents each sample holds in that member."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from fastload.converters.sample import Sample, SourceItem, file_stamp
from fastload.converters.sources import Document, SourceOptions, decode_text, inside_source
from fastload.errors import DatasetIndexError, SampleError
from fastload.fields import LABEL_FIELD, image_field, parse_label
from fastload.formats.idx import IDX_WHITESPACE, split_member_name
from fastload.formats.index import read_index
from fastload.formats.tar_headers import TarDamage, read_tar_members


def unsafe_member_reason(name: str) -> str | None:
    """Why a tar member name must not be used (absolute, climbing out with '..', or what the .idx
    format cannot hold: whitespace, bytes that are not UTF-8), else None."""
    if name.isascii() and name[:1] != "/" and ".." not in name and not IDX_WHITESPACE.search(name):
        return None  # the usual name, judged without building a path (2 us a member)
    path = PurePosixPath(name)
    if path.is_absolute() or name.startswith("/"):
        return f"absolute member name {name!r}"
    if ".." in path.parts:
        return f"member name {name!r} contains '..'"
    if IDX_WHITESPACE.search(name):
        return f"member name {name!r} holds whitespace, which the .idx format cannot hold"
    if not _is_utf8(name):
        return f"member name {name!r} is not UTF-8, which the .idx format needs"
    return None


def _is_utf8(name: str) -> bool:
    """False for a name decoded with surrogate escapes (its bytes are not UTF-8)."""
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True


ScannedSample = tuple[str, dict[str, tuple[int, int]], str | None]  # (key, {ext: (data offset, size)}, why it is refused or None)


def scan_tar(path: Path) -> tuple[list[ScannedSample], TarDamage | None]:
    """Group a tar's regular files (and hard links, as the files they name) into samples, and say
    where it is damaged (None: read to its end). Of a damaged tar, the samples before the damage
    are kept but the last of them, which may have lost members to it, is refused; an unreadable
    file is a ValueError naming it."""
    try:
        members, damage = read_tar_members(path), None
    except TarDamage as exc:
        members, damage = exc.members, exc
    except OSError as exc:
        raise ValueError(f"{path}: not a readable tar ({exc.strerror})") from None
    samples: list[ScannedSample] = []
    for _, name, offset, size in members:
        key, ext = split_member_name(name)
        if not key or key.endswith("/"):
            continue  # hidden files such as ./.DS_Store
        if not samples or samples[-1][0] != key:
            samples.append((key, {}, None))
        _, fields, refused = samples[-1]
        if refused is None and ext in fields:
            refused = f"member {name!r} repeats field {ext!r} of its sample (one key, two .{ext} members)"
        fields[ext] = (offset, size)
        samples[-1] = (key, fields, refused or unsafe_member_reason(name))
    if damage is not None and samples:
        key, fields, refused = samples[-1]
        samples[-1] = (key, fields, refused or f"the tar is damaged right after it ({damage.reason}): it may have lost members")
    return samples, damage


@dataclass(frozen=True)
class WdsSource:
    """Samples of tar shards in shard order; ``cls`` gives the label, the image field (if any) the image."""

    shards: tuple[Path, ...]
    classes: tuple[str, ...] | None

    def items(self) -> list[SourceItem]:
        """One item per sample key of every shard; after the samples of a damaged shard, one item
        standing for what the damage lost (loading it raises, so the loss is an error naming the
        tar, or with ``--on-error skip`` a skip reported in skipped.jsonl, never silent)."""
        out = []
        for shard in self.shards:
            stamp = file_stamp(shard)
            samples, damage = scan_tar(shard)
            for raw_key, fields, unsafe in samples:
                size = sum(size for _, size in fields.values())
                key = raw_key if _is_utf8(raw_key) else raw_key.encode(errors="surrogateescape").decode(errors="backslashreplace")
                out.append(SourceItem(key=key, where=f"{shard}:{key}", size_hint=size, ref=(shard, fields, unsafe), stamp=stamp))
            if damage is not None:
                lost = f"damaged tar ({damage.reason}): the samples from byte {damage.at} on are lost, their number unknown"
                out.append(SourceItem(key=f"{shard.name}@{damage.at}", where=str(shard), size_hint=0, ref=(shard, None, lost), stamp=stamp))
        return out

    def load(self, item: SourceItem) -> Sample:
        """Read the sample's members by offset."""
        shard, fields, unsafe = item.ref
        if fields is None:  # what a damaged tar lost
            raise SampleError(item.where, unsafe)
        if unsafe:
            raise SampleError(item.where, f"rejected: {unsafe}")
        values: dict[str, bytes] = {}
        try:
            fd = os.open(shard, os.O_RDONLY)
            try:
                for ext, (offset, size) in fields.items():
                    values[ext] = os.pread(fd, size, offset)
            finally:
                os.close(fd)
        except OSError as exc:
            raise SampleError(item.where, f"unreadable: {exc.strerror or exc}") from None
        field = image_field(values)
        image = values.pop(field) if field is not None else None
        label = parse_label(values.pop(LABEL_FIELD), item.where) if LABEL_FIELD in values else None
        return Sample(key=item.key, where=item.where, image=image, label=label, extra=values)


@dataclass(frozen=True)
class WdsTextSource:
    """Documents of tar shards: each sample's member of extension ``text_field`` (``txt``), a tar an item."""

    shards: tuple[Path, ...]
    text_field: str
    classes: tuple[str, ...] | None = None

    def items(self) -> list[SourceItem]:
        """One item per tar."""
        return [SourceItem(key=shard.stem, where=str(shard), size_hint=shard.stat().st_size, ref=shard, stamp=file_stamp(shard))
                for shard in self.shards]

    def documents(self, item: SourceItem) -> Iterator[Document]:
        """Each sample's text in tar order (a sample without the member, a refused one, invalid
        UTF-8, and what a damaged tar lost reported, not raised)."""
        shard = item.ref
        samples, damage = scan_tar(shard)
        fd = os.open(shard, os.O_RDONLY)
        try:
            for key, fields, refused in samples:
                where = f"{shard}:{key}"
                if refused:
                    yield Document(where, None, f"rejected: {refused}")
                elif self.text_field not in fields:
                    yield Document(where, None, f"no .{self.text_field} member (fields {', '.join(sorted(fields))})")
                else:
                    offset, size = fields[self.text_field]
                    text, problem = decode_text(os.pread(fd, size, offset))
                    if text is not None and not text:
                        text, problem = None, f"empty document (member .{self.text_field})"
                    yield Document(where, text, problem)
        finally:
            os.close(fd)
        if damage is not None:
            yield Document(str(shard), None, f"damaged tar ({damage.reason}): the documents from byte {damage.at} on are lost, their number unknown")


def open_source(path: str, options: SourceOptions) -> WdsSource | WdsTextSource:
    """Open a .tar file or a folder of .tar shards (sorted); classes come from its index.json if
    any; with ``text_field``, the documents in that member of each sample."""
    p = Path(path)
    shards = tuple(inside_source(p, f, options.follow_symlinks) for f in sorted(p.glob("*.tar"))) if p.is_dir() else (p,)
    if not shards or not shards[0].is_file():
        raise FileNotFoundError(f"{path}: no .tar shards")
    if options.text_field is not None:
        return WdsTextSource(shards=shards, text_field=options.text_field)
    classes = None
    if p.is_dir():
        try:
            classes = read_index(p).classes
        except DatasetIndexError:
            classes = None
    return WdsSource(shards=shards, classes=classes)
