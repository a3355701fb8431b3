"""``fastload.TokenDataLoader`` (what ``fastload.DataLoader(tokens, seq_len=L, ...)`` makes): batches
of packed token rows from a token dataset or a mixture of them by tokens.

The API follows how the training loops consume batches: it is a ``torch.utils.data.DataLoader``
(Lightning and Accelerate's ``prepare`` keep it, as they keep fastload.DataLoader), it yields a
dict of tensors named as Hugging Face models take them (``Trainer`` passes the dict to the model,
as a torchtitan-style loop splits it into inputs and ``labels``), and ``state_dict()`` /
``load_state_dict()`` resume it exactly (Accelerate's ``save_state``, torchtitan's Stateful
checkpoints, Lightning's loop state).

Every global step is ``world_size * batch_size`` rows of the epoch's row sequence (fastload.loading.
token_rows), rank r taking the r-th ``batch_size`` of them; rows past the epoch's end are padding
(every rank makes the same number of steps). So a step's batch is a pure function of (seed,
epoch, step, rank, world size), the state is (epoch, rows consumed) plus, for best-fit, where its
packing got to, and a resume at another world size continues with the rows not yet consumed.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from fastload.dist import check_ranks_agree, resolve_rank_world
from fastload.loading.options import LoaderOptions
from fastload.loading.state import LoaderState, OrderSettings, read_state_dict
from fastload.loading.stats import LoaderStats
from fastload.loading.token_batch import IGNORE_INDEX, assemble
from fastload.loading.token_rows import BestFitRows, Packing, PaddedRows, Row, Segment, StreamRows, TokenCorpus
from fastload.orders.mixture import member_seed
from fastload.orders.position import Position
from fastload.storage.dataset import ShardedDataset
from fastload.storage.mixture import MixedDataset
from fastload.text.token_order import mixture_members

BLOCK_TOKENS = 1 << 16  # the stream's blocks: documents are shuffled within one, blocks within the epoch


@dataclass(frozen=True)
class TokenOptions:
    """What rows are made of: their length, the packing, the stream's block size, the ignore index."""

    seq_len: int
    packing: Packing = Packing.CONCAT
    block_tokens: int = BLOCK_TOKENS
    ignore_index: int = IGNORE_INDEX

    def __post_init__(self) -> None:
        if not isinstance(self.seq_len, int) or self.seq_len < 1:
            raise ValueError(f"seq_len must be a positive number of tokens, got {self.seq_len!r}")
        object.__setattr__(self, "packing", Packing(self.packing))
        if self.block_tokens < self.seq_len and self.packing is Packing.BEST_FIT:
            raise ValueError("best-fit packs a block of the stream at a time: block_tokens must be at least seq_len")
        if self.block_tokens < 1:
            raise ValueError("block_tokens must be >= 1")


class MixtureRows:
    """Rows of a mixture by tokens: row k from the member :func:`mixture_members` gives it, that
    member's rows (concat) running through its own epochs, each with its own seed."""

    def __init__(self, mixture: MixedDataset, corpus: TokenCorpus, options: TokenOptions, seed: int, epoch: int, shuffle: bool) -> None:
        self.mixture, self.options, self.seed, self.shuffle = mixture, options, seed, shuffle
        self.corpora = [TokenCorpus(member) for member in mixture.members]
        self.sizes = [-(-c.total // options.seq_len) for c in self.corpora]
        self.bases = [int(corpus.token_starts[first]) for first in mixture.first_shards[:-1]]
        self.length = sum(self.sizes)
        self.epoch = epoch
        self._streams: dict[tuple[int, int], StreamRows] = {}

    def __len__(self) -> int:
        return self.length

    def row(self, k: int) -> Row:
        """Row ``k`` of the mixture epoch (in the mixture's global token space)."""
        (member,), (local,) = mixture_members(np.array([self.epoch * self.length + k]), self.mixture.weights)
        member_epoch, row = divmod(int(local), self.sizes[member])
        stream = self._streams.get((member, member_epoch))
        if stream is None:
            stream = StreamRows(self.corpora[member], self.options.seq_len, self.options.block_tokens,
                                member_seed(self.seed, member), member_epoch, self.shuffle)
            self._streams = {key: s for key, s in self._streams.items() if key[0] != member}
            self._streams[(member, member_epoch)] = stream
        base = self.bases[member]
        return [replace(segment, start=segment.start + base) for segment in stream.row(row)]


class TokenDataLoader(torch.utils.data.DataLoader):
    """Packed rows of ``seq_len`` tokens, ``batch_size`` a batch; see the module docstring.

    ``packing``: ``"concat"`` (the shuffled stream cut into rows, no padding), ``"best-fit"``
    (documents packed by best-fit decreasing within each block of the stream, long ones split) or
    ``"pad"`` (a document a row, cut or padded to ``seq_len``). ``dataset``: a token dataset's
    folder, URL or ``fastload.open``, or ``fastload.mix({...}, by="tokens")`` (concat rows).
    """

    def __init__(self, dataset: Any, batch_size: int = 1, shuffle: bool | None = True, num_workers: int = 0, drop_last: bool = False,
                 *, seq_len: int, packing: str = "concat", seed: int = 0, rank: int | None = None, world_size: int | None = None,
                 device: str | torch.device | None = None, block_tokens: int = BLOCK_TOKENS, ignore_index: int = IGNORE_INDEX) -> None:
        sharded = dataset if isinstance(dataset, ShardedDataset) else ShardedDataset(dataset)
        self.corpus = TokenCorpus(sharded)
        self.tokens = TokenOptions(seq_len, Packing(packing), block_tokens, ignore_index)
        self.options = LoaderOptions(batch_size=batch_size, shuffle=bool(shuffle), num_workers=num_workers, drop_last=drop_last, seed=seed,
                                     rank=rank, world_size=world_size,
                                     device=torch.device(device) if device is not None else None)
        self.mixture = sharded if isinstance(sharded, MixedDataset) else None
        if self.mixture is not None and self.tokens.packing is not Packing.CONCAT:
            raise ValueError("a mixture by tokens is made of concat rows (every row seq_len tokens of one member): packing='concat'")
        self.dataset, self.sharded = sharded, sharded  # type: ignore[assignment]  # torch annotates a map-style Dataset
        self.batch_size, self.drop_last, self.num_workers, self.seed = batch_size, drop_last, num_workers, seed
        self.shuffle, self.device, self.seq_len = bool(shuffle), self.options.device, seq_len
        self.sampler, self.batch_sampler, self.collate_fn = None, None, None  # type: ignore[assignment]  # order is the loader's own
        self.pin_memory, self.timeout, self.prefetch_factor, self.persistent_workers = False, 0, None, False
        self.worker_init_fn, self.generator, self.multiprocessing_context, self.in_order = None, None, None, True
        tokenizer = self.corpus.tokenizer
        self.pad_id = next(i for i in (tokenizer.pad_id, tokenizer.eos_id, 0) if i is not None)
        self.state = LoaderState()
        self.stats = LoaderStats()
        self._rows: tuple[int, Any] | None = None  # (epoch, its rows)
        self._cursor: tuple[int, tuple[int, int]] | None = None  # a loaded best-fit cursor: (epoch, (block, first row))
        self._active: weakref.ref[TokenEpoch] | None = None
        self._agreed = False

    # the surface torch's loader and the frameworks read --------------------------------------------

    @property
    def _is_accelerate_prepared(self) -> bool:
        """Read by accelerate's ``prepare()``: True keeps this loader (it shards by rank itself)."""
        return True

    @_is_accelerate_prepared.setter
    def _is_accelerate_prepared(self, value: bool) -> None:  # accelerate's prepare() also sets it
        pass

    def ranks(self) -> tuple[int, int]:
        """(rank, world size), resolved when asked (rank=/world_size=, the process group, the launcher's environment)."""
        return resolve_rank_world(self.options.rank, self.options.world_size)

    def rows(self, epoch: int) -> StreamRows | PaddedRows | BestFitRows | MixtureRows:
        """The rows of ``epoch`` (the current epoch's kept, with its best-fit cursor)."""
        if self._rows is None or self._rows[0] != epoch:
            seed, shuffle, tokens = self.seed, self.shuffle, self.tokens
            rows: StreamRows | PaddedRows | BestFitRows | MixtureRows
            if self.mixture is not None:
                rows = MixtureRows(self.mixture, self.corpus, tokens, seed, epoch, shuffle)
            elif tokens.packing is Packing.CONCAT:
                rows = StreamRows(self.corpus, tokens.seq_len, tokens.block_tokens, seed, epoch, shuffle)
            elif tokens.packing is Packing.PAD:
                rows = PaddedRows(self.corpus, tokens.seq_len, seed, epoch, shuffle)
            else:
                cursor = self._cursor[1] if self._cursor is not None and self._cursor[0] == epoch else (0, 0)
                rows = BestFitRows(self.corpus, tokens.seq_len, tokens.block_tokens, seed, epoch, shuffle, cursor)
            self._rows = (epoch, rows)
        return self._rows[1]

    def row(self, epoch: int, k: int) -> Row | None:
        """Row ``k`` of ``epoch`` (None past the epoch's end)."""
        rows = self.rows(epoch)
        if isinstance(rows, BestFitRows):
            return rows.row(k)
        return rows.row(k) if k < len(rows) else None

    def steps(self, epoch: int, consumed: int) -> int | None:
        """Global steps left in ``epoch`` after ``consumed`` rows (None for best-fit: found as it goes)."""
        rows = self.rows(epoch)
        if isinstance(rows, BestFitRows):
            return None
        step = self.options.batch_size * self.ranks()[1]
        left = max(len(rows) - consumed, 0)
        return left // step if self.drop_last else -(-left // step)

    def __len__(self) -> int:
        position = self.state.upcoming()
        steps = self.steps(position.epoch, 0)
        if steps is None:  # best-fit: every block of the epoch packed once to count its rows
            rows = self.rows(position.epoch)
            assert isinstance(rows, BestFitRows)
            step = self.options.batch_size * self.ranks()[1]
            total = rows.count()
            steps = total // step if self.drop_last else -(-total // step)
        return steps

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:  # type: ignore[override]
        previous = self._active() if self._active is not None else None
        if previous is not None:
            previous.close()
        epoch = TokenEpoch(self)
        self._active = weakref.ref(epoch)
        return epoch

    def set_epoch(self, epoch: int) -> None:
        """The next iteration yields ``epoch`` from its start (as torch's DistributedSampler.set_epoch)."""
        self.state.set_epoch(epoch)

    @property
    def identity(self) -> str:
        """A digest of the tokens this loader reads and how it packs them (recorded in state_dict)."""
        digest = hashlib.sha256()
        for shard in self.sharded.index.shards:
            digest.update(f"{shard.path}|{shard.tokens}|{shard.sha256};".encode())
        digest.update(f"{self.tokens.seq_len}|{self.tokens.packing.value}|{self.tokens.block_tokens}".encode())
        if self.mixture is not None:
            digest.update(f"mix{self.mixture.weights}".encode())
        return digest.hexdigest()[:16]

    def _settings(self) -> OrderSettings:
        return OrderSettings(False, self.shuffle, 1)

    def state_dict(self) -> dict[str, Any]:
        """Where training is: (seed, epoch, rows consumed), the topology, and best-fit's cursor."""
        state = self.state.state_dict(self.seed, self.identity, (self.ranks()[1], self.options.batch_size), self._settings())
        rows = self._rows[1] if self._rows is not None and self._rows[0] == self.state.position.epoch else None
        if isinstance(rows, BestFitRows) and rows.cursor[1] <= self.state.position.consumed:
            state["packing_cursor"] = list(rows.cursor)  # the block holding a row not yet consumed, and its first row
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration yields the rows of that epoch not yet consumed, at any world size."""
        position = read_state_dict(state, self.seed, self.identity, (self.ranks()[1], self.options.batch_size), self._settings())
        active = self._active() if self._active is not None else None
        if active is not None:
            active.close()
        self.state.restore(position)
        cursor = state.get("packing_cursor")
        self._cursor = (position.epoch, (int(cursor[0]), int(cursor[1]))) if cursor is not None else None
        self._rows = None

    def describe(self, step: int, epoch: int | None = None) -> list[list[dict[str, Any]]]:
        """This rank's batch at ``step`` of ``epoch`` (default: the current one): each row's
        segments, each named by its shard, document number, first token in the document and length."""
        epoch = self.state.epoch if epoch is None else epoch
        rank, world = self.ranks()
        first = step * world * self.options.batch_size + rank * self.options.batch_size
        out = []
        for k in range(first, first + self.options.batch_size):
            row = self.row(epoch, k) or []
            out.append([self._describe_segment(segment) for segment in row])
        return out

    def _describe_segment(self, segment: Segment) -> dict[str, Any]:
        _, document = self.corpus.where(segment.start)
        shard = self.corpus.shard_of(segment.start)
        shard_name = self.sharded.shard_name(shard)  # a mixture's: its member's location before it
        reader = self.corpus.reader(shard)
        first = int(self.corpus.token_starts[shard]) + int(reader.offsets()[document])
        return {"shard": shard_name, "document": document, "offset": segment.start - first, "tokens": segment.length}

    def _check_agree(self) -> None:
        if not self._agreed:
            check_ranks_agree({"seed": self.seed, "batch_size": self.options.batch_size, "seq_len": self.tokens.seq_len,
                               "world_size": self.ranks()[1], "dataset (its identity digest)": int(self.identity[:15], 16)},
                              "fastload.TokenDataLoader")
            self._agreed = True

    def close(self) -> None:
        """End the iteration under way and close this process's shard files."""
        active = self._active() if self._active is not None else None
        if active is not None:
            active.close()
        self.sharded.close()

    def __enter__(self) -> TokenDataLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TokenEpoch:
    """One pass over this rank's steps of an epoch, from the loader's position; advances it with
    each batch handed out (only those count), finishes it with the last, breaks it off if closed early."""

    def __init__(self, loader: TokenDataLoader) -> None:
        self.loader = loader
        self.started = self.finished = False
        self.token: object = None

    def __iter__(self) -> TokenEpoch:
        return self

    def _start(self) -> None:
        loader = self.loader
        loader._check_agree()
        self.start: Position = loader.state.begin()
        self.rank, self.world = loader.ranks()
        self.step_rows = loader.options.batch_size * self.world
        self.left = loader.steps(self.start.epoch, self.start.consumed)
        self.done = 0
        self.started = True
        self.token = loader.stats.begin_epoch(self.start.epoch, None, loader.sharded.downloads)

    def _has_step(self) -> bool:
        if self.left is not None:
            return self.done < self.left
        first = self.start.consumed + self.done * self.step_rows  # best-fit: while the step's first (or last) row exists
        probe = first + (self.step_rows - 1 if self.loader.drop_last else 0)
        return self.loader.row(self.start.epoch, probe) is not None

    def __next__(self) -> dict[str, torch.Tensor]:
        loader = self.loader
        if self.finished:
            raise StopIteration
        if not self.started:
            self._start()
        if not self._has_step():
            self._finish()
            raise StopIteration
        with loader.stats.waiting():
            first = self.start.consumed + self.done * self.step_rows + self.rank * loader.options.batch_size
            rows = [loader.row(self.start.epoch, k) or [] for k in range(first, first + loader.options.batch_size)]
            arrays = assemble(rows, loader.tokens.seq_len, loader.corpus, loader.pad_id, loader.tokens.ignore_index)
        batch = {name: torch.from_numpy(value) for name, value in arrays.items()}
        if loader.device is not None:
            with loader.stats.to_device():
                batch = {name: value.to(loader.device, non_blocking=True) for name, value in batch.items()}
        loader.stats.record_batch(sum(1 for row in rows if row))
        loader.stats.record_tokens(int(arrays["attention_mask"].sum()))
        self.done += 1
        position = replace(self.start, consumed=self.start.consumed + self.done * self.step_rows)
        if self.left is not None and self.done >= self.left:
            loader.state.advance(position)
            self._finish()
        else:
            loader.state.advance(position)
        return batch

    def _finish(self) -> None:
        if not self.finished:
            self.finished = True
            self.loader.state.finish()
            self.loader.stats.end_epoch(self.token, complete=True)

    def close(self) -> None:
        """Abandon the epoch: the next iteration starts it over; state_dict() still says where it stopped."""
        if self.started and not self.finished:
            self.loader.state.break_off()
            self.loader.stats.end_epoch(self.token, complete=False)
        self.finished = True

    def __del__(self) -> None:
        if not self.finished:
            try:
                self.close()
            except Exception:
                pass
