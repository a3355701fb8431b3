"""Documents into token shards, on the conversion's engine: the plan (items cut into shards of
about ``shard_tokens`` tokens) and one shard's work (its documents' exact dedupe: converters.dedupe).

Shards are planned before anything is tokenized, so the plan (and every shard's bytes) stays a
pure function of the input and the options, whatever the engine and the number of workers: each
item's tokens are estimated from its size, at the tokens per byte measured on SAMPLE_BYTES of
text from items spread over the plan (tokenized one text at a time in the driver, so the workers
it forks keep their tokenizers' thread pools). A shard then holds about ``shard_tokens`` tokens
as far as the text's tokens per byte holds across the corpus, within an item's worth (a plain
JSONL chunk; a compressed file or a Parquet row group: all of it).
"""

from __future__ import annotations

import itertools
import logging
import math
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import cast

import numpy as np

from fastload._util.files import naming
from fastload.converters.convert_options import ConvertOptions, TokenizeOptions
from fastload.converters.plan import ShardPlan, assign_shards
from fastload.converters.sample import SourceItem
from fastload.converters.shard import ShardResult, sources_digest, upload_shard
from fastload.converters.sources import Document, TextRun, TextSource, text_runs
from fastload.errors import SampleError
from fastload.formats.index import TokenizerIdentity
from fastload.formats.table import TABLE_SUFFIX
from fastload.formats.tokens.reader import DOCS_SUFFIX, TOKENS_FIELD
from fastload.formats.tokens.writer import TokenShardWriter
from fastload.formats.writing import WriterOptions, open_writer
from fastload.text.tokenizer import TextTokenizer, with_fast_encoder

log = logging.getLogger("fastload")

SAMPLE_BYTES = 1 << 18  # text tokenized to estimate tokens per byte
SCAN_BYTES = 16 << 20  # the most of a sampled item's text read to measure its share of the item's bytes
SAMPLED_ITEMS = 16  # items the estimate samples, spread evenly over the plan
BATCH_DOCUMENTS = 2048  # documents tokenized at once (encode_batch_fast spreads them over the cores)
BATCH_BYTES = 4 << 20  # ... or fewer, once their text holds this many characters (a run's part joins whole)


@lru_cache(maxsize=4)
def _tokenizer(options: TokenizeOptions, fast: bool = False) -> TextTokenizer:
    """This process's tokenizer (loaded once per process, options and encoder; both encoders share
    one ``tokenizers`` object)."""
    if fast:
        return _tokenizer(options).fast_twin()
    return TextTokenizer(options.tokenizer, options.bos_token, options.eos_token, options.allow_special_tokens)


def _chosen_tokenizer(options: TokenizeOptions, source: TextSource, items: list[SourceItem]) -> TextTokenizer:
    """The tokenizer on the encoder ``options.encoder`` asks for: fastokens ("fast", "auto") where it
    loads and gives tokenizers' ids on a sample of the documents; else tokenizers (transformers for a
    folder), saying why in one line ("auto"), or a ValueError ("fast")."""
    tokenizer = _tokenizer(options)
    if options.encoder == "tokenizers":
        return tokenizer
    # this process's fast tokenizer, checked and loaded here once: the workers forked later inherit it
    chosen, why = with_fast_encoder(tokenizer, sample_texts(source, items), _tokenizer(options, fast=True))
    if why is not None:
        if options.encoder == "fast":
            raise ValueError(f"--encoder fast: {why}")
        log.warning("fastload: encoding with %s, not fastokens: %s", (tokenizer.identity.encoder or "").split()[0], why)
    return chosen


def tokenizer_identity(options: TokenizeOptions, source: TextSource, items: list[SourceItem]) -> TokenizerIdentity:
    """The identity of the tokenizer ``options`` name, on the encoder chosen for the documents of
    ``items``, checked for what the options ask of it."""
    identity = _chosen_tokenizer(options, source, items).identity
    for wanted, name, value in ((options.bos, "bos", identity.bos_id), (options.append_eos, "eos", identity.eos_id)):
        if wanted and value is None:
            raise ValueError(f"{options.tokenizer}: the tokenizer names no {name} token; give --{name}-token TEXT")
    return identity


def _encodes_fast(identity: TokenizerIdentity) -> bool:
    """Whether the conversion's ids are made by fastokens (the encoder its identity records)."""
    return (identity.encoder or "").startswith("fastokens ")


def tokens_per_byte(source: TextSource, items: list[SourceItem], options: TokenizeOptions, fast: bool = False) -> float:
    """Tokens per byte of item size, measured on up to SAMPLED_ITEMS items spread evenly over
    ``items``: the first SAMPLE_BYTES / SAMPLED_ITEMS of each one's text tokenized (``fast``: by
    fastokens, checked to give tokenizers' ids on these very texts, so the count is the same), and
    the share of each one's size that is text (from up to SCAN_BYTES of its text)."""
    sample: list[str] = []
    sampled = text_bytes = sizes = 0
    for item in _sampled_items(items):
        taken = read = 0
        for document in source.documents(item):
            if document.text is None:
                continue
            size = len(document.text.encode())
            read += size
            if taken < SAMPLE_BYTES // SAMPLED_ITEMS:
                sample.append(document.text)
                taken += size
            if read >= SCAN_BYTES:
                break
        sampled += taken
        text_bytes += read
        sizes += item.size_hint if read < SCAN_BYTES else read  # an item read in part: its text counts as its size
    if not sampled:
        return 1 / 4  # no readable text where sampled: English averages about 4 bytes a token
    count = int(_tokenizer(options, fast=True).encode_arrays(sample)[1].sum()) if fast else _tokenizer(options).count_tokens(sample)
    return count / sampled * (text_bytes / max(sizes, 1))


def _sampled_items(items: list[SourceItem]) -> list[SourceItem]:
    """Up to SAMPLED_ITEMS of ``items``, spread evenly over them."""
    return [items[i] for i in sorted({round(i * (len(items) - 1) / max(SAMPLED_ITEMS - 1, 1)) for i in range(min(SAMPLED_ITEMS, len(items)))})]


def sample_texts(source: TextSource, items: list[SourceItem]) -> list[str]:
    """The first SAMPLE_BYTES / SAMPLED_ITEMS of text of each item ``_sampled_items`` picks (the
    documents ``tokens_per_byte`` tokenizes)."""
    texts: list[str] = []
    for item in _sampled_items(items):
        taken = 0
        for document in source.documents(item):
            if taken >= SAMPLE_BYTES // SAMPLED_ITEMS:
                break
            if document.text is not None:
                texts.append(document.text)
                taken += len(document.text.encode())
    return texts


def plan_token_shards(source: TextSource, items: list[SourceItem], options: TokenizeOptions,
                      identity: TokenizerIdentity | None = None) -> list[ShardPlan]:
    """The items cut into consecutive shards of about ``options.shard_tokens`` estimated tokens
    (``identity``: the conversion's tokenizer, whose encoder counts the sample)."""
    rate = tokens_per_byte(source, items, options, identity is not None and _encodes_fast(identity))
    estimated = [replace(item, size_hint=math.ceil(item.size_hint * rate)) for item in items]
    return assign_shards(estimated, "tokens", options.shard_tokens, None, overhead=0)


@dataclass(frozen=True)
class FirstDocuments:
    """A source of documents cut after its first ones (``--limit``): the item keyed ``last_key``
    yields only its first ``last_count`` documents (picklable, as the source is)."""

    source: TextSource
    last_key: str
    last_count: int
    classes: tuple[str, ...] | None = None

    def items(self) -> list[SourceItem]:
        """The source's items (first_documents keeps those it needs)."""
        return self.source.items()

    def documents(self, item: SourceItem) -> Iterator[Document]:
        """The item's documents, the last item's only up to the cut."""
        documents = self.source.documents(item)
        yield from itertools.islice(documents, self.last_count) if item.key == self.last_key else documents


def first_documents(source: TextSource, items: list[SourceItem], limit: int) -> tuple[TextSource, list[SourceItem]]:
    """The items holding the first ``limit`` documents (counted here, item by item, until there
    are that many) and the source cut after them; all of them where they hold fewer."""
    if limit == 0:
        return source, []
    seen = 0
    for position, item in enumerate(items):
        count = sum(1 for _ in itertools.islice(source.documents(item), limit - seen))
        seen += count
        if seen == limit:
            return cast(TextSource, FirstDocuments(source, item.key, count)), items[: position + 1]  # frozen: classes read-only
    return source, items


@dataclass(frozen=True)
class TokenShardTask:
    """Everything a worker needs to write one token shard, picklable."""

    source: TextSource
    plan: ShardPlan
    out_dir: str
    options: ConvertOptions
    identity: TokenizerIdentity  # the tokenizer's, as the driver read it
    drops: tuple[tuple[int, ...], ...] = ()  # per item of the plan, the documents dropped as duplicates
    upload_to: str | None = None


def write_token_shard(task: TokenShardTask) -> ShardResult:
    """Tokenize the plan's documents into one shard; bad documents raise or, with
    ``on_error="skip"``, are left out and reported."""
    path = Path(task.out_dir) / task.plan.name
    with naming(path):
        builder = TokenShardBuilder(task, path)
        try:
            for number, item in enumerate(task.plan.items):
                dropped = set(task.drops[number]) if task.drops else set()
                first = 0  # the item's documents before this run
                for run in text_runs(task.source, item):
                    if isinstance(run, Document):
                        if first not in dropped:
                            builder.reject(item, run.where, run.problem or "unreadable")
                        first += 1
                        continue
                    count = len(run.texts)
                    if dropped and not dropped.isdisjoint(range(first, first + count)):
                        kept = [k for k in range(count) if first + k not in dropped]
                        run = TextRun([run.texts[k] for k in kept], [run.wheres[k] for k in kept])
                    builder.add(item, run)
                    first += count
            return builder.finish()
        except BaseException:
            builder.writer.abort()
            raise


class TokenShardBuilder:
    """One token shard filled run by run: texts gathered into batches, each tokenized at once,
    given bos/eos, filtered by length and appended to the writer."""

    def __init__(self, task: TokenShardTask, path: Path) -> None:
        self.task, self.path, self.options = task, path, task.options
        tokens = task.options.tokens
        assert tokens is not None  # a token shard task is made for token conversions only
        self.tokens = tokens
        self.tokenizer = _tokenizer(tokens, fast=_encodes_fast(task.identity))
        if self.tokenizer.identity.sha256 != task.identity.sha256:
            raise ValueError(f"{tokens.tokenizer}: the tokenizer changed while the conversion ran (its sha256 differs)")
        if self.tokenizer.identity.encoder != task.identity.encoder:
            raise ValueError(f"{tokens.tokenizer}: this process encodes with {self.tokenizer.identity.encoder}, "
                             f"the conversion with {task.identity.encoder}")
        self.writer: TokenShardWriter = open_writer("tokens", path, WriterOptions(token_dtype=task.identity.dtype))  # type: ignore[assignment]
        self.result = ShardResult(number=task.plan.number, info=None, fields=[TOKENS_FIELD])
        self._texts: list[str] = []
        self._parts: list[tuple[int, SourceItem, TextRun, int]] = []  # (first in the batch, item, run, first of the run)
        self._bytes = 0

    def reject(self, item: SourceItem, where: str, reason: str) -> None:
        """A document that cannot be used: raised, or skipped and reported (``on_error``)."""
        if self.options.on_error == "raise":
            raise SampleError(where, reason)
        self.result.skipped.append({"key": item.key, "where": where, "reason": reason})

    def add(self, item: SourceItem, run: TextRun) -> None:
        """Queue a run of documents' texts; each full batch is tokenized and written."""
        texts, taken = run.texts, 0
        while taken < len(texts):
            part = texts[taken : taken + BATCH_DOCUMENTS - len(self._texts)]
            self._parts.append((len(self._texts), item, run, taken))
            self._texts += part
            self._bytes += sum(map(len, part))
            taken += len(part)
            if len(self._texts) >= BATCH_DOCUMENTS or self._bytes >= BATCH_BYTES:
                self._flush()

    def _document(self, at: int) -> tuple[SourceItem, str]:
        """The item and place of the batch's document ``at``."""
        begin, item, run, first = self._parts[bisect_right([part[0] for part in self._parts], at) - 1]
        return item, run.wheres[first + at - begin]

    def _flush(self) -> None:
        if not self._texts:
            return
        ids, lengths = self.tokenizer.encode_arrays(self._texts)
        identity, tokens = self.task.identity, self.tokens
        ids, lengths = with_specials(ids, lengths, identity.bos_id if tokens.bos else None,
                                     identity.eos_id if tokens.append_eos else None)
        keep = np.ones(len(lengths), dtype=bool)
        added = int(tokens.bos) + int(tokens.append_eos)
        for at in np.flatnonzero((lengths <= added) | (lengths > tokens.shard_tokens)).tolist():
            item, where = self._document(at)
            if lengths[at] <= added:
                self.reject(item, where, "empty document (no tokens)")
            else:
                self.reject(item, where, f"{int(lengths[at])} tokens, more than a shard holds (--shard-tokens {tokens.shard_tokens})")
            keep[at] = False
        short = keep & (lengths < tokens.min_tokens)
        self.result.filtered += int(short.sum())
        keep &= ~short
        if not keep.all():
            ids = ids[np.repeat(keep, lengths)]
            lengths = lengths[keep]
        self.writer.add_documents(ids, lengths)
        self._texts, self._parts, self._bytes = [], [], 0

    def finish(self) -> ShardResult:
        """Publish the shard (none when no document was kept) and upload it where asked."""
        self._flush()
        result = self.result
        if self.writer.tokens == 0:
            self.writer.abort()
            for stale in (self.path, self.path.with_suffix(DOCS_SUFFIX), self.path.with_suffix(TABLE_SUFFIX)):
                stale.unlink(missing_ok=True)  # a previous run's copy
        else:
            result.info = self.writer.finish()
        result.sources = sources_digest(self.task.plan.items)
        if self.task.upload_to is not None and result.info is not None:
            upload_shard(Path(self.task.out_dir), result.info, self.task.upload_to)
        return result


def with_specials(ids: np.ndarray, lengths: np.ndarray, bos: int | None, eos: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Documents (ids back to back, each one's count) with ``bos`` put before and ``eos`` after each."""
    extra = (bos is not None) + (eos is not None)
    if not extra:
        return ids, lengths
    new_lengths = lengths + extra
    ends = np.cumsum(new_lengths)
    starts = ends - new_lengths
    out = np.empty(int(ends[-1]) if len(ends) else 0, dtype=ids.dtype)
    body = np.ones(len(out), dtype=bool)
    if bos is not None:
        out[starts] = bos
        body[starts] = False
    if eos is not None:
        out[ends - 1] = eos
        body[ends - 1] = False
    out[body] = ids
    return out, new_lengths
