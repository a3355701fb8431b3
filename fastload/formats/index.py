"""The contract between shard writers and readers: a versioned ``index.json`` at the dataset root.

Writers (``converters``) produce it last, after every shard is complete; readers (the loader,
``inspect``, ``verify``) trust nothing else about a dataset. Per-sample byte offsets of tar shards
live beside each shard in DALI's ``.idx`` format (:mod:`fastload.formats.idx`), and every
sample's key, label and field spans in the shard's sample table (:mod:`fastload.formats.table`);
the file helpers that read and write them are in :mod:`fastload._util.files`.
"""

from __future__ import annotations

import json
import os
from dataclasses import MISSING, asdict, dataclass, field
from dataclasses import fields as dataclass_fields
from pathlib import Path

import numpy as np

from fastload._util.files import atomic_write_bytes, read_file
from fastload.errors import DatasetIndexError
from fastload.fields import ROLES, STREAM_FIELDS, stream_fields
from fastload.formats.part_table import PartTable
from fastload.formats.shard_formats import LAYOUTS, shard_format
from fastload.formats.shard_info import IN_PLACE_FIELDS, MAX_INT, ShardInfo, check_counts, check_int, check_sha256, check_strings

FORMAT_NAME = "fastload"
FORMAT_VERSION = 3  # 2: HDF5 byte columns stored flat (a group of `bytes` + `offsets`); 3: per-shard sample tables
VIDEO_FORMAT_VERSION = 4  # 4: sample tables of version 2, with videos' stream facts (written only for a dataset holding videos)
# 5: token datasets (layout "tokens": the tokenizer, tokens per shard). Only they are written as 5, so a reader
# of versions 1-4 still reads every image and video dataset and refuses a token dataset by its version.
TOKENS_VERSION = 5
# 6: data read in place (layout "parquet": row groups of Parquet files as shards, their columns' roles). Only
# those are written as 6, so an older fastload refuses them by version rather than misreading a row group.
IN_PLACE_VERSION = 6
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6)
INDEX_FILE = "index.json"
SKIPPED_REPORT = "skipped.jsonl"





TOKEN_DTYPES = {"uint16": 2**16, "uint32": 2**32}  # a token shard's dtype -> the ids it can hold


SPECIAL_TEXT = ("ordinary", "special")  # how a special token's text in a document is encoded (TokenizerIdentity.special_text)


def token_dtype(vocab_size: int) -> str:
    """The smallest dtype holding every id of a vocabulary of ``vocab_size``."""
    return "uint16" if vocab_size <= TOKEN_DTYPES["uint16"] else "uint32"


@dataclass(frozen=True)
class TokenizerIdentity:
    """The tokenizer a token dataset was made with: the sha256 of its file (of its files, for a
    ``transformers`` folder), its vocabulary size (every id is below it), its special ids, and
    the dtype the shards store ids in; how documents' text was encoded (``special_text``) and by
    what (``encoder``), both absent from indexes written before they were recorded."""

    sha256: str
    vocab_size: int
    dtype: str
    kind: str = "tokenizer.json"  # or "transformers" (a folder read by transformers.AutoTokenizer)
    bos_id: int | None = None
    eos_id: int | None = None
    pad_id: int | None = None
    special: dict[str, int] = field(default_factory=dict)  # every special token's id by its text
    # A special token's text inside a document: "ordinary" (encoded as ordinary text, as tiktoken's
    # encode_ordinary does), "special" (as the special token's id: --allow-special-tokens), or None:
    # not recorded (indexes written before it was; those conversions gave the special ids)
    special_text: str | None = None
    encoder: str | None = None  # the library and version that made the ids, e.g. "tokenizers 0.21.0" (None: not recorded)

    def __post_init__(self) -> None:
        check_sha256(self.sha256, "tokenizer.sha256")
        check_int(self.vocab_size, "tokenizer.vocab_size", minimum=1)
        if self.dtype not in TOKEN_DTYPES or self.vocab_size > TOKEN_DTYPES[self.dtype]:
            raise DatasetIndexError(f"tokenizer.dtype: must be one of {sorted(TOKEN_DTYPES)} holding ids below vocab_size")
        if self.kind not in ("tokenizer.json", "transformers"):
            raise DatasetIndexError("tokenizer.kind: must be 'tokenizer.json' or 'transformers'")
        for name in ("bos_id", "eos_id", "pad_id"):
            value = getattr(self, name)
            if value is not None:
                check_int(value, f"tokenizer.{name}")
                if value >= self.vocab_size:
                    raise DatasetIndexError(f"tokenizer.{name}: must be below vocab_size")
        if not isinstance(self.special, dict) or not all(isinstance(k, str) for k in self.special):
            raise DatasetIndexError("tokenizer.special: must be an object of ids")
        for value in self.special.values():
            check_int(value, "tokenizer.special")
        if self.special_text not in (None, *SPECIAL_TEXT):
            raise DatasetIndexError(f"tokenizer.special_text: must be one of {list(SPECIAL_TEXT)}")
        if self.encoder is not None and not isinstance(self.encoder, str):
            raise DatasetIndexError("tokenizer.encoder: must be a string")


@dataclass(frozen=True)
class DatasetIndex:
    """Everything a reader needs to know about a converted dataset."""

    layout: str
    shards: tuple[ShardInfo, ...] | PartTable  # data read in place: a PartTable (its parts made as asked for)
    fields: tuple[str, ...]
    classes: tuple[str, ...] | None = None
    class_counts: dict[str, int] = field(default_factory=dict)
    image_fields: tuple[str, ...] = ()
    decoded_shape: tuple[int, ...] | None = None  # HDF5 holding fixed-size decoded pixels
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count
    duplicates: int = 0
    source: str = ""  # the source kind it was converted from
    conversion: dict = field(default_factory=dict)  # the options that produced it
    tokenizer: TokenizerIdentity | None = None  # a token dataset's tokenizer (layout "tokens")
    columns: dict[str, str] = field(default_factory=dict)  # data read in place: each field (column) -> its role (fastload.fields)
    format: str = FORMAT_NAME
    version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        """Check every field with its type (an index may come from anyone)."""
        if self.format != FORMAT_NAME:
            raise DatasetIndexError("format: not a fastload index")
        check_version(self.version)
        if self.layout not in LAYOUTS:
            raise DatasetIndexError(f"layout: must be one of {LAYOUTS}")
        if shard_format(self.layout).in_place and isinstance(self.shards, tuple):  # listed shard by shard: kept as a PartTable
            for number, shard in enumerate(self.shards):
                if not isinstance(shard, ShardInfo) or shard.row_group is None:
                    raise DatasetIndexError(f"shards[{number}].row_group: missing")
            object.__setattr__(self, "shards", PartTable.of(self.shards))
        if not isinstance(self.shards, PartTable) and (not isinstance(self.shards, tuple) or not all(isinstance(s, ShardInfo) for s in self.shards)):
            raise DatasetIndexError("shards: must be a list of shards")
        check_strings(self.fields, "fields")
        check_strings(self.image_fields, "image_fields")
        if self.classes is not None:
            check_strings(self.classes, "classes")
        check_counts(self.class_counts, "class_counts")
        check_counts(self.skipped, "skipped")
        check_int(self.duplicates, "duplicates")
        if not isinstance(self.source, str):
            raise DatasetIndexError("source: must be a string")
        if not isinstance(self.conversion, dict):
            raise DatasetIndexError("conversion: must be an object")
        if self.decoded_shape is not None:
            if not shard_format(self.layout).holds_pixels:
                raise DatasetIndexError(f"decoded_shape: a {self.layout} dataset holds no decoded pixels")
            if not isinstance(self.decoded_shape, tuple) or len(self.decoded_shape) != 3:
                raise DatasetIndexError("decoded_shape: must be [height, width, channels]")
            for side in self.decoded_shape:
                check_int(side, "decoded_shape", minimum=1)
        if self.num_samples > MAX_INT:
            raise DatasetIndexError("shards: more than 2**63 - 1 samples in all")
        self._check_tokens()
        self._check_in_place()
        if self.version == VIDEO_FORMAT_VERSION and not stream_fields(self.fields):
            streams = " or ".join(STREAM_FIELDS)  # the media roles: video or audio
            raise DatasetIndexError(f"fields: a {streams} dataset (version {VIDEO_FORMAT_VERSION}) lists no {streams} field")

    def _check_tokens(self) -> None:
        """A token dataset (and only one) names its tokenizer, is of version 5 and counts each shard's tokens."""
        tokens = shard_format(self.layout).holds_tokens
        if tokens != (self.tokenizer is not None):
            raise DatasetIndexError(f"tokenizer: {'missing' if tokens else 'only a token dataset names one'}")
        if tokens != (self.version == TOKENS_VERSION) and not shard_format(self.layout).in_place:
            raise DatasetIndexError(f"version: a {'token' if tokens else 'non-token'} dataset is of version "
                                    f"{TOKENS_VERSION if tokens else f'1 to {TOKENS_VERSION - 1}'}")  # in place: _check_in_place
        if self.tokenizer is not None and not isinstance(self.tokenizer, TokenizerIdentity):
            raise DatasetIndexError("tokenizer: must be an object")
        for number, shard in enumerate(() if isinstance(self.shards, PartTable) else self.shards):  # a part counts no tokens
            if tokens != (shard.tokens is not None):
                raise DatasetIndexError(f"shards[{number}].tokens: {'missing' if tokens else 'only a token shard counts tokens'}")
        if self.num_tokens > MAX_INT:
            raise DatasetIndexError("shards: more than 2**63 - 1 tokens in all")

    def _check_in_place(self) -> None:
        """Data read in place (and only it) is of version 6, its shards row groups, its columns' roles known ones."""
        in_place = shard_format(self.layout).in_place
        if in_place != (self.version == IN_PLACE_VERSION):
            raise DatasetIndexError(f"version: {'data read in place is' if in_place else 'only data read in place is'} of version {IN_PLACE_VERSION}")
        if not isinstance(self.columns, dict) or not all(isinstance(k, str) and v in ROLES for k, v in self.columns.items()):
            raise DatasetIndexError(f"columns: must be an object of roles ({', '.join(ROLES)})")
        if self.columns and not in_place:
            raise DatasetIndexError("columns: only data read in place gives its columns' roles")
        if in_place != isinstance(self.shards, PartTable):  # a PartTable's parts are all row groups
            raise DatasetIndexError(f"shards: {'data read in place lists its files and parts' if in_place else 'only data read in place lists parts of files'}")

    @property
    def num_tokens(self) -> int:
        """Total tokens over all shards (0 for a dataset of other samples)."""
        return 0 if isinstance(self.shards, PartTable) else sum(s.tokens or 0 for s in self.shards)

    @property
    def num_samples(self) -> int:
        """Total samples over all shards."""
        return int(self.shard_samples().sum()) if isinstance(self.shards, PartTable) else sum(s.samples for s in self.shards)

    @property
    def total_bytes(self) -> int:
        """Total bytes over all shards."""
        return int(self.shards.column("bytes").sum()) if isinstance(self.shards, PartTable) else sum(s.bytes for s in self.shards)

    def shard_samples(self) -> np.ndarray:
        """Each shard's samples (int64), without making a shard of a PartTable."""
        if isinstance(self.shards, PartTable):
            return self.shards.column("samples")
        return np.array([s.samples for s in self.shards], dtype=np.int64)

    def to_json(self) -> str:
        """Serialise deterministically (sorted keys, no timestamps) so reruns are byte-identical."""
        data = asdict(self)  # a PartTable is copied as it is, then written as its own form
        data["num_samples"] = self.num_samples
        if shard_format(self.layout).in_place:
            data["num_tokens"] = self.num_tokens
            data["shards"] = PartTable.of(self.shards).to_json()
            del data["tokenizer"]
            return json.dumps(data, indent=1, sort_keys=True) + "\n"
        del data["columns"]  # the same bytes as before data was read in place
        for shard in data["shards"]:
            for name in IN_PLACE_FIELDS:
                del shard[name]
        if self.tokenizer is None:
            del data["tokenizer"]  # the same bytes as before token datasets existed
            for shard in data["shards"]:
                del shard["tokens"]
        else:
            data["num_tokens"] = self.num_tokens
        return json.dumps(data, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, where: str = INDEX_FILE) -> DatasetIndex:
        """Parse and validate index.json; ``where`` names the file in errors, which name the field
        that is wrong but never repeat what the file holds."""
        try:
            data = json.loads(text.decode() if isinstance(text, bytes) else text)
        except UnicodeDecodeError as exc:
            raise DatasetIndexError(f"{where}: not UTF-8 text (at byte {exc.start})") from None
        except (ValueError, RecursionError) as exc:  # JSONDecodeError says where, not what
            raise DatasetIndexError(f"{where}: not JSON ({type(exc).__name__}: {exc})") from None
        try:
            if isinstance(data, dict) and "version" in data:  # a newer index is refused by its version, before its fields
                check_version(data["version"])
            _check_keys(cls, data, "the index")
            total = data.pop("num_samples", None)
            total_tokens = data.pop("num_tokens", None)
            if isinstance(data.get("shards"), dict):
                data["shards"] = PartTable.from_json(data["shards"])
            elif not isinstance(data.get("shards"), list):
                raise DatasetIndexError("shards: must be a list of shards")
            shards = []
            for number, shard in enumerate(data["shards"] if isinstance(data["shards"], list) else ()):
                _check_keys(ShardInfo, shard, f"shards[{number}]")
                try:
                    shards.append(ShardInfo(**shard))
                except DatasetIndexError as exc:
                    raise DatasetIndexError(f"shards[{number}].{exc}") from None
            if isinstance(data["shards"], list):
                data["shards"] = tuple(shards)
            for name in ("fields", "image_fields", "classes", "decoded_shape"):
                data[name] = _as_tuple(data.get(name))
            data["image_fields"] = data["image_fields"] or ()  # absent or null: none
            if data.get("tokenizer") is not None:
                _check_keys(TokenizerIdentity, data["tokenizer"], "tokenizer")
                data["tokenizer"] = TokenizerIdentity(**data["tokenizer"])
            index = cls(**data)
            if total is not None:
                check_int(total, "num_samples")
                if total != index.num_samples:
                    raise DatasetIndexError(f"num_samples: says {total}, the shards hold {index.num_samples}")
            if total_tokens is not None:
                check_int(total_tokens, "num_tokens")
                if total_tokens != index.num_tokens:
                    raise DatasetIndexError(f"num_tokens: says {total_tokens}, the shards hold {index.num_tokens}")
            return index
        except DatasetIndexError as exc:
            raise DatasetIndexError(f"{where}: {exc}") from None


def check_version(version: object) -> None:
    """A DatasetIndexError unless ``version`` is one this fastload reads (checked before anything
    else, so a newer index is refused by its version rather than by the fields it added)."""
    check_int(version, "version")
    if version not in READABLE_VERSIONS:
        raise DatasetIndexError(f"index version {version} is not supported (this fastload reads {READABLE_VERSIONS})")


def _check_keys(cls: type, data: object, name: str) -> None:
    """That ``data`` is a JSON object holding ``cls``'s required fields and no others (counted, not
    repeated: they are the file's content)."""
    if not isinstance(data, dict):
        raise DatasetIndexError(f"{name}: must be an object")
    known = {f.name for f in dataclass_fields(cls)} | ({"num_samples", "num_tokens"} if cls is DatasetIndex else set())
    unknown = sum(1 for key in data if key not in known)
    if unknown:
        raise DatasetIndexError(f"{name}: {unknown} unknown field(s)")
    required = [f.name for f in dataclass_fields(cls) if f.default is MISSING and f.default_factory is MISSING]
    missing = [key for key in required if key not in data]
    if missing:
        raise DatasetIndexError(f"{name}: missing {', '.join(missing)}")


def _as_tuple(value: object) -> object:
    """A JSON list as a tuple; anything else (null included) as it is, for the dataclass to check."""
    return tuple(value) if isinstance(value, list) else value


def read_index(root: str | os.PathLike[str]) -> DatasetIndex:
    """Read ``ROOT/index.json``; raises :class:`DatasetIndexError` naming the file when it is unusable."""
    path = Path(root) / INDEX_FILE
    try:
        data = read_file(path)
    except FileNotFoundError:
        raise DatasetIndexError(
            f"{path}: no index.json — not a converted dataset, or its conversion has not finished"
        ) from None
    except OSError as exc:
        raise DatasetIndexError(f"{path}: cannot read it ({exc.strerror})") from None
    return DatasetIndex.from_json(data, where=str(path))


def write_index(root: str | os.PathLike[str], index: DatasetIndex) -> None:
    """Write ``ROOT/index.json`` atomically; called last, after every shard is in place."""
    atomic_write_bytes(Path(root) / INDEX_FILE, index.to_json().encode())
