"""The conversion's settings, validated once, in one frozen dataclass."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace

from fastload._util.sizes import parse_size
from fastload.av.facts import REENCODE_KEYFRAME_INTERVAL
from fastload.converters.sources import SOURCE_MODULES, TEXT_ONLY, SourceOptions
from fastload.decode.header import MAX_PIXELS
from fastload.errors import check_on_error
from fastload.formats.shard_formats import WRITTEN_LAYOUTS
from fastload.formats.writing import WriterOptions

__all__ = ["ConvertOptions", "TokenizeOptions", "parse_size"]
TOKENS_LAYOUT = "tokens"
ENCODERS = ("tokenizers", "fast", "auto")  # what encodes documents' text (TokenizeOptions.encoder)
CHUNK_BYTES = 8 << 20  # the most text bytes of a plain JSONL file an item holds
CHUNKS_PER_SHARD = 16  # ... and at least a shard's estimated bytes over this many (shards filled to within a chunk)
MIN_CHUNK_BYTES = 64 << 10


@dataclass(frozen=True)
class TokenizeOptions:
    """Turning documents into token shards: the tokenizer (a local ``tokenizer.json`` or
    ``transformers`` folder), what is added to each document, which are kept, how big a shard is."""

    tokenizer: str
    append_eos: bool = False  # end every document with the tokenizer's eos id
    bos: bool = False  # start every document with its bos id
    min_tokens: int = 1  # documents with fewer tokens (after bos/eos) are left out and counted
    shard_tokens: int = 100_000_000  # about this many tokens a shard (planned from text bytes: see converters.tokens)
    bos_token: str | None = None  # the bos/eos token's text, where the tokenizer's config does not name it
    eos_token: str | None = None
    allow_special_tokens: bool = False  # a special token's text in a document gets its id (else: encoded as ordinary text)
    encoder: str = "auto"  # "tokenizers"; "fast": fastokens (checked to give the same ids); "auto": fast where it can be

    def __post_init__(self) -> None:
        if self.encoder not in ENCODERS:
            raise ValueError(f"encoder must be one of {', '.join(ENCODERS)}, got {self.encoder!r}")
        if self.min_tokens < 1:
            raise ValueError("min_tokens must be >= 1 (empty documents are never kept)")
        if self.shard_tokens < 1:
            raise ValueError("shard_tokens must be >= 1")


@dataclass(frozen=True)
class ConvertOptions:
    """Everything ``fastload convert`` takes; equal options and input give byte-identical output."""

    source: str
    layout: str = "wds"
    shard_bytes: int | None = 256 * 10**6
    samples_per_shard: int | None = None
    shuffle: bool = False
    seed: int = 0
    workers: int = 1
    limit: int | None = None
    dedupe: bool = False  # drop exact duplicates (content hash)
    near_threshold: int | None = None  # drop near duplicates: perceptual signatures this many bits apart or closer
    on_error: str = "raise"
    reencode_quality: int | None = None
    max_size: int | None = None
    max_pixels: int = MAX_PIXELS  # the one limit every decode path applies (fastload.decode.header)
    reencode_video: bool = False  # videos re-encoded to H.264 (also when max_size shrinks them)
    keyframe_interval: int = REENCODE_KEYFRAME_INTERVAL  # frames between keyframes of a re-encoded video
    audio_codec: str | None = None  # recordings re-encoded to this codec (fastload.av.pyav.AUDIO_ENCODERS); with audio_rate alone: flac
    audio_rate: int | None = None  # recordings resampled to this rate when re-encoded
    source_options: SourceOptions = field(default_factory=SourceOptions)
    writer_options: WriterOptions = field(default_factory=WriterOptions)
    tokens: TokenizeOptions | None = None  # documents into token shards (layout "tokens")

    def __post_init__(self) -> None:
        if self.source not in SOURCE_MODULES:
            raise ValueError(f"unknown source {self.source!r}; expected one of {sorted(SOURCE_MODULES)}")
        if self.layout not in WRITTEN_LAYOUTS:
            raise ValueError(f"unknown output layout {self.layout!r}; expected one of {sorted(WRITTEN_LAYOUTS)}")
        check_on_error(self.on_error)
        if self.samples_per_shard is not None:
            if self.samples_per_shard < 1:
                raise ValueError("samples_per_shard must be >= 1")
            object.__setattr__(self, "shard_bytes", None)
        elif self.shard_bytes is None or self.shard_bytes < 1:
            raise ValueError("give a positive shard size in bytes or samples_per_shard")
        if self.workers < 1:
            raise ValueError("workers must be >= 1")
        if self.limit is not None and self.limit < 0:
            raise ValueError("limit must be >= 0")
        if self.reencode_quality is not None and not 1 <= self.reencode_quality <= 100:
            raise ValueError("reencode_quality must be in 1..100")
        if self.max_pixels < 1:
            raise ValueError("max_pixels must be >= 1")
        if self.max_size is not None and self.max_size < 1:
            raise ValueError("max_size must be >= 1")
        from fastload.media import MEDIA_ROLES

        for media in MEDIA_ROLES.values():  # each media role's conversion options (video's --reencode, audio's --audio-codec...)
            media.conversion.check(self)
        if self.near_threshold is not None:
            from fastload.near.search import check_threshold

            check_threshold(self.near_threshold)
            if self.dedupe:
                raise ValueError("choose exact (dedupe) or near (near_threshold) deduplication, not both")
        if self.writer_options.hdf5_decoded and self.layout != "hdf5":
            raise ValueError("decoded pixel storage is an HDF5 option (--to hdf5)")
        self._check_tokens()

    def _check_tokens(self) -> None:
        """Documents become token shards exactly when a tokenizer is given, from a source of documents."""
        if (self.layout == TOKENS_LAYOUT) != (self.tokens is not None):
            raise ValueError("token shards (--to tokens) are made with a tokenizer (--tokenizer), and a tokenizer makes only them")
        if self.tokens is None:
            if self.source in TEXT_ONLY:
                raise ValueError(f"--from {self.source} holds documents: give --tokenizer to make token shards")
            return
        if self.source not in TEXT_ONLY and self.source_options.text_field is None:
            raise ValueError(f"--from {self.source} with a tokenizer needs --text-field (the column or member holding the text)")
        if self.near_threshold is not None:
            raise ValueError("documents are deduplicated exactly (--dedupe), not by near-duplicate image signatures")
        if self.reencode_quality is not None or self.max_size is not None:
            raise ValueError("--reencode-quality and --max-size are image options, not for token shards")
        if self.shuffle:
            raise ValueError("--shuffle orders samples before sharding; token shards keep their documents in source order "
                             "(the token loader shuffles them each epoch): leave it out")
        chunk = min(CHUNK_BYTES, max(MIN_CHUNK_BYTES, 4 * self.tokens.shard_tokens // CHUNKS_PER_SHARD))  # ~4 bytes a token
        object.__setattr__(self, "source_options", replace(self.source_options, chunk_bytes=chunk))

    def fingerprint(self) -> dict:
        """The settings that determine the output bytes (not ``workers``), for resume checks."""
        data = asdict(self)
        data.pop("workers")
        if data["tokens"] is not None:
            data["tokens"].pop("encoder")  # the same ids whichever encodes them (the one that did: in the index's tokenizer)
        if self.near_threshold is None:
            data.pop("near_threshold")  # absent when off: indexes written before it existed still match
        from fastload.media import MEDIA_ROLES

        for media in MEDIA_ROLES.values():  # likewise each media role's options when off
            for name in media.conversion.unset(self):
                data.pop(name)
        return json.loads(json.dumps(data))  # as plan.json reads it back: a tuple option (--allow-root) compares as a list
