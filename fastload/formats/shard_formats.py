"""The shard layouts a dataset can be stored in, as one table (index.json's ``layout`` names the
row): the shard file's suffix, the files beside it, how a reader is opened and which module
writes it. A layout is a folder, ``formats/NAME/`` (``reader.py``, ``writer.py`` and a README.md
of its files on disk), and its row here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from fastload.formats.token_counts import ShardTokens

if TYPE_CHECKING:
    from fastload.formats.shard_info import ShardInfo
    from fastload.formats.shard_reader import ShardReader
    from fastload.formats.table import SampleTable


class OpenReader(Protocol):
    """Opens a reader over one shard's files (see :func:`fastload.formats.shard_files.open_shard_files`):
    ``offsets``, the file beside it that locates its samples (a tar's ``.idx``, a token shard's
    document table), ``samples`` it holds, the dataset's ``decoded_shape`` (pixels stored decoded),
    how many shards a process may hold open, its sample table, the dataset root its files must stay
    inside, and for a token shard its :class:`ShardTokens`; data read in place gets its index entry
    (``shard``) and its columns' roles."""

    def __call__(self, data: str | Path, offsets: str | Path | None, samples: int, decoded_shape: tuple[int, ...] | None,
                 open_files: int, table: SampleTable | None, root: str | None, tokens: ShardTokens | None,
                 shard: ShardInfo | None = None, columns: Mapping[str, str] | None = None) -> ShardReader: ...


@dataclass(frozen=True)
class ShardFormat:
    """One shard layout as stored."""

    layout: str  # its name in index.json
    suffix: str  # the shard file's ending
    offsets_beside: bool  # a DALI ``.idx`` beside each shard (read where the shard has no sample table)
    reads_through_table: bool  # its reader finds samples through the shard's sample table (else its own columns)
    opened_by_path: bool  # its library opens the file by path (h5py): the path is checked against the root first
    holds_pixels: bool  # may store decoded pixels (index.json's decoded_shape) instead of encoded images
    open_reader: OpenReader
    writer: str  # the module whose ``open_writer(path, options)`` writes one shard (fastload.formats.writing.open_writer)
    holds_tokens: bool = False  # token ids of documents (fastload.formats.tokens.reader), its table (the offsets beside it) their boundaries
    sample_tables: bool = True  # a fastload sample table (fastload.formats.table) beside each shard
    in_place: bool = False  # data read where it is (fastload index LOCATION): a shard is a part of a file (a row group)


def _open_tar(data: str | Path, offsets: str | Path | None, samples: int, decoded_shape: tuple[int, ...] | None,
              open_files: int, table: SampleTable | None, root: str | None, tokens: ShardTokens | None,
              shard: ShardInfo | None = None, columns: Mapping[str, str] | None = None) -> ShardReader:
    from fastload.formats.wds.reader import TarShardReader

    if offsets is None and table is None:
        raise ValueError(f"{data}: a tar shard is read through its sample table or its offset index; neither given")
    return TarShardReader(data, offsets, samples, table, root)


def _open_hdf5(data: str | Path, offsets: str | Path | None, samples: int, decoded_shape: tuple[int, ...] | None,
               open_files: int, table: SampleTable | None, root: str | None, tokens: ShardTokens | None,
               shard: ShardInfo | None = None, columns: Mapping[str, str] | None = None) -> ShardReader:
    from fastload.formats.hdf5.reader import Hdf5ShardReader, chunk_cache_bytes

    return Hdf5ShardReader(Path(data), samples, decoded_shape, chunk_cache_bytes(open_files))


def _open_tokens(data: str | Path, offsets: str | Path | None, samples: int, decoded_shape: tuple[int, ...] | None,
                 open_files: int, table: SampleTable | None, root: str | None, tokens: ShardTokens | None,
                 shard: ShardInfo | None = None, columns: Mapping[str, str] | None = None) -> ShardReader:
    from fastload.formats.tokens.reader import TokenShardReader

    if offsets is None or tokens is None:
        raise ValueError(f"{data}: a token shard is read with its document table and its token counts; not given")
    return TokenShardReader(data, offsets, samples, tokens, root)


def _open_parquet(data: str | Path, offsets: str | Path | None, samples: int, decoded_shape: tuple[int, ...] | None,
                  open_files: int, table: SampleTable | None, root: str | None, tokens: ShardTokens | None,
                  shard: ShardInfo | None = None, columns: Mapping[str, str] | None = None) -> ShardReader:
    from fastload.formats.parquet.reader import ParquetGroupReader

    if shard is None or columns is None:
        raise ValueError(f"{data}: a Parquet row group is read with its index entry and its columns' roles; not given")
    return ParquetGroupReader(data, shard, columns, offsets)  # offsets: a remote file's fetched footer


def _open_arrow(data: str | Path, offsets: str | Path | None, samples: int, decoded_shape: tuple[int, ...] | None,
                open_files: int, table: SampleTable | None, root: str | None, tokens: ShardTokens | None,
                shard: ShardInfo | None = None, columns: Mapping[str, str] | None = None) -> ShardReader:
    from fastload.formats.arrow.reader import ArrowBatchReader

    if shard is None or columns is None:
        raise ValueError(f"{data}: an Arrow record batch is read with its index entry and its columns' roles; not given")
    return ArrowBatchReader(data, shard, columns)


def _open_lance(data: str | Path, offsets: str | Path | None, samples: int, decoded_shape: tuple[int, ...] | None,
                open_files: int, table: SampleTable | None, root: str | None, tokens: ShardTokens | None,
                shard: ShardInfo | None = None, columns: Mapping[str, str] | None = None) -> ShardReader:
    from fastload.formats.lance.reader import LanceSliceReader

    if shard is None or columns is None:
        raise ValueError(f"{data}: a Lance fragment is read with its index entry and its columns' roles; not given")
    return LanceSliceReader(data, shard, columns, shard.version)


SHARD_FORMATS: dict[str, ShardFormat] = {
    "wds": ShardFormat("wds", ".tar", offsets_beside=True, reads_through_table=True, opened_by_path=False,
                       holds_pixels=False, open_reader=_open_tar, writer="fastload.formats.wds.writer"),
    "hdf5": ShardFormat("hdf5", ".h5", offsets_beside=False, reads_through_table=False, opened_by_path=True,
                        holds_pixels=True, open_reader=_open_hdf5, writer="fastload.formats.hdf5.writer"),
    "tokens": ShardFormat("tokens", ".bin", offsets_beside=False, reads_through_table=False, opened_by_path=False,
                          holds_pixels=False, open_reader=_open_tokens, writer="fastload.formats.tokens.writer",
                          holds_tokens=True, sample_tables=False),  # written from documents (fastload.converters.tokens)
    "parquet": ShardFormat("parquet", ".parquet", offsets_beside=False, reads_through_table=False, opened_by_path=True,
                           holds_pixels=False, open_reader=_open_parquet, writer="", sample_tables=False,
                           in_place=True),  # read where it is (fastload/formats/parquet/README.md): written by others
    "arrow": ShardFormat("arrow", ".arrow", offsets_beside=False, reads_through_table=False, opened_by_path=True,
                         holds_pixels=False, open_reader=_open_arrow, writer="", sample_tables=False, in_place=True),
    "lance": ShardFormat("lance", ".lance", offsets_beside=False, reads_through_table=False, opened_by_path=True,
                         holds_pixels=False, open_reader=_open_lance, writer="", sample_tables=False, in_place=True),
}
LAYOUTS: tuple[str, ...] = tuple(SHARD_FORMATS)
WRITTEN_LAYOUTS: tuple[str, ...] = tuple(name for name, row in SHARD_FORMATS.items() if not row.in_place)  # convert --to's choices


def shard_format(layout: str) -> ShardFormat:
    """The row of ``layout`` (an index's, already checked against :data:`LAYOUTS`)."""
    return SHARD_FORMATS[layout]
