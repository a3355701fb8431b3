"""Packed token rows as a kind of batch: rows of ``seq_len`` tokens from a token dataset or a
mixture of them by tokens, ``batch_size`` a batch, as a dict of tensors named as Hugging Face
models take them (fastload.text.token_batch).

Every global step is ``world_size * batch_size`` rows of the epoch's row sequence
(fastload.text.token_rows), rank r taking the r-th ``batch_size`` of them, and the epoch's last,
partial step its rows split evenly over the ranks; rows past the epoch's end are padding (every
rank makes the same number of steps, and a rank's batch is all padding only when fewer rows than
ranks are left). So a step's batch is a pure function of (seed, epoch, step, rank, world size), the
state is (epoch, rows consumed) plus, for best-fit, where its packing got to, and a resume at
another world size continues with the rows not yet consumed (at another seq_len too, but for a
mixture's rows: fastload.text.token_rows' origin).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import torch

from fastload._util.dist import resolve_rank_world
from fastload.backends.cpu.pool_engine import CpuWorkers
from fastload.backends.cpu.token_epoch import TokenEpoch, TokenEpochInputs
from fastload.loading.loader_options import LoaderOptions
from fastload.loading.state import LoaderState, OrderSettings, read_state_dict, state_number
from fastload.loading.stats import LoaderStats
from fastload.orders.position import Position
from fastload.storage.dataset import ShardedDataset
from fastload.storage.mixed_dataset import MixedDataset
from fastload.text.epoch_rows import MixtureRows
from fastload.text.token_batch import Attention, BatchFiller, BatchFormat
from fastload.text.token_rows import Packing, TokenOptions, TokenRows, choice, read_cursor
from fastload.text.token_samplers import TokenBatchIndices, TokenBatchRequest, token_collate


class TokenBatches:
    """Batches of packed token rows; see the module docstring. ``tokens``: seq_len, packing,
    block_tokens, ignore_index and packing_window, checked (fastload.text.token_rows.TokenOptions)."""

    backend = "cpu"

    def __init__(self, sharded: ShardedDataset, tokens: TokenOptions, options: LoaderOptions, state: LoaderState, stats: LoaderStats,
                 batch_format: str, attention: str | None) -> None:
        self.sharded, self.tokens, self.options, self.state, self.stats = sharded, tokens, options, state, stats
        self.rows = TokenRows(sharded, tokens, options.seed, options.shuffle)
        self.corpus = self.rows.corpus
        self.mixture = sharded if isinstance(sharded, MixedDataset) else None
        self.pad_id = self.corpus.pad_id
        self.filler = BatchFiller(self.corpus, tokens.seq_len, self.pad_id, tokens.ignore_index, choice(BatchFormat, batch_format, "batch_format"),
                                  None if attention is None else choice(Attention, attention, "attention"))
        self.engine = CpuWorkers(TokenEpoch)
        self.collate_fn = token_collate

    def ranks(self) -> tuple[int, int]:
        """(rank, world size), resolved when asked (rank=/world_size=, the process group, the launcher's environment)."""
        return resolve_rank_world(self.options.rank, self.options.world_size)

    def epoch_length(self, epoch: int) -> int:
        """Rows in ``epoch`` (best-fit: every window's rows counted)."""
        return self.rows.length(epoch)

    def batch_count(self, position: Position) -> int:
        """This rank's steps in the epoch at ``position`` from its start (best-fit: every block counted, once per loader)."""
        total = self.rows.length(position.epoch, self.rows.origin(position.resumed_from))
        step = self.options.batch_size * self.ranks()[1]
        return total // step if self.options.drop_last else -(-total // step)

    def epoch(self, device: torch.device | None, accelerate: bool, before_start: Callable[[], None]) -> TokenEpoch:
        """An iterator over the next epoch's batches, made by the token workers."""
        inputs = TokenEpochInputs(self.sharded, self.rows, self.filler, self.options, device, self.state, self.stats,
                                  accelerate, before_start, self.ranks)
        return self.engine.epoch(inputs)

    def upcoming_batches(self, position: Position, device: torch.device | None) -> list[TokenBatchIndices]:
        """This rank's batches from ``position`` as row numbers, each carrying how to make it (any device: rows are made on the CPU)."""
        epoch, options = position.epoch, self.options
        origin = self.rows.origin(position.resumed_from) if position.consumed else None  # from the epoch's start: rows cut from it
        rank, world = self.ranks()
        batches = self.rows.rank_batches(epoch, position.consumed, options.batch_size, rank, world, options.drop_last, origin)
        return [TokenBatchIndices(range(first, first + count),
                                  TokenBatchRequest(self.tokens, self.filler.format, self.filler.attention, options.seed, options.shuffle,
                                                    self.pad_id, epoch, first, cursor, options.batch_size))
                for first, count, cursor in batches]

    def identity(self) -> str:
        """A digest of the tokens read and how they are packed (recorded in state_dict)."""
        return self._identity(self.tokens.seq_len)

    def _identity(self, seq_len: int) -> str:
        """:meth:`identity` as a loader of rows of ``seq_len`` tokens has it (a state saved at another seq_len names that one)."""
        digest = hashlib.sha256()
        digest.update(self.corpus.identity().encode())
        options = self.tokens
        digest.update(f"{seq_len}|{options.packing.value}|{options.block_tokens}".encode())
        if options.packing is Packing.BEST_FIT:
            digest.update(f"|{options.window_blocks}".encode())
        if self.mixture is not None:
            digest.update(f"mix{self.mixture.weights}".encode())
            if self.mixture.schedule is not None:  # it decides the rows' members as the weights do
                digest.update(f"{self.mixture.schedule.as_dict()}".encode())
        return digest.hexdigest()[:16]

    def agreement(self) -> dict[str, int | bool]:
        """The settings every rank must share."""
        return {"seed": self.options.seed, "batch_size": self.options.batch_size, "seq_len": self.tokens.seq_len,
                "world_size": self.ranks()[1], "dataset (its identity digest)": int(self.identity()[:15], 16)}

    def _row_settings(self) -> dict[str, Any]:
        """What cuts the stream into rows, by argument name (the part of :meth:`identity` a user sets)."""
        options = self.tokens
        settings: dict[str, Any] = {"seq_len": options.seq_len, "packing": options.packing.value, "block_tokens": options.block_tokens}
        if options.packing is Packing.BEST_FIT:
            settings["packing_window"] = options.window_blocks * options.block_tokens  # as packed: whole blocks of the stream
        return settings

    def _seq_len_may_change(self) -> bool:
        """Whether a state saved at another seq_len resumes here: concat rows go on from the stream's token the
        saved rows ended at, pad rows from the same document, best-fit's from the pieces of the saved window its
        rows did not hold; a mixture's row schedule counts rows of the saved length."""
        return self.mixture is None

    def _check_rows(self, state: dict[str, Any]) -> int:
        """The seq_len ``state`` was saved at; a state saved with rows cut another way (packing, block_tokens,
        best-fit's window; seq_len for mixtures) is refused naming each argument that changed:
        its rows consumed would name other tokens here."""
        saved = state.get("rows")
        if not isinstance(saved, dict):
            return self.tokens.seq_len  # saved before the settings were recorded: the identity check names the dataset
        free = {"seq_len"} if self._seq_len_may_change() and saved.get("packing") == self.tokens.packing.value else set()
        changed = [f"{name}={saved.get(name)!r} (this loader: {value!r})" for name, value in self._row_settings().items()
                   if saved.get(name) != value and name not in free]
        if changed:
            why = ("" if "seq_len" in free or saved.get("seq_len") == self.tokens.seq_len else
                   " (only rows of one dataset, with the packing they were saved with, resume at another seq_len: "
                   "a mixture by tokens deals its members in rows of the saved length)")
            raise ValueError(f"state was saved with {', '.join(changed)}: its {state.get('samples_consumed')} rows consumed of epoch "
                             f"{state.get('epoch')} are cut from the token stream another way, so here they would name other tokens{why}. "
                             "Resume with the saved values to finish that epoch (batch_size and world_size may change), then change "
                             "them at the next epoch's start (a new loader, set_epoch(next epoch), no state loaded)")
        return state_number(saved.get("seq_len"), "rows.seq_len", 1)

    def _settings(self) -> OrderSettings:
        return OrderSettings(False, self.options.shuffle, 1)

    def state_dict(self) -> dict[str, Any]:
        """(seed, epoch, rows consumed), the topology, the row settings, and for best-fit the window
        holding the next row with that window's first row (so a resume counts on from there)."""
        state = self.state.state_dict(self.options.seed, self.identity(), (self.ranks()[1], self.options.batch_size), self._settings())
        position = self.state.position
        cursor = self.rows.packing_cursor(position.epoch, position.consumed, position.resumed_from)
        if cursor is not None:
            state["packing_cursor"] = cursor
        state["rows"] = self._row_settings()
        return state

    def read_state(self, state: dict[str, Any]) -> Position:
        """The position ``state`` names, at any world size and batch size, and but for a mixture at any seq_len too
        (concat from the stream's token the saved rows ended at, pad from the next document, best-fit from the pieces
        of the saved window its rows did not hold; the rest cut as saved: packing, block_tokens, window)."""
        saved_len = self._check_rows(state)
        cursor = state.get("packing_cursor")
        position = read_state_dict(state, self.options.seed, self._identity(saved_len), (self.ranks()[1], self.options.batch_size),
                                   self._settings(), lambda p: self.rows.resume_rows(p.epoch, p.consumed, cursor, self.rows.origin(p.resumed_from)),
                                   "rows", (saved_len, self.tokens.seq_len), None if cursor is None else read_cursor(cursor))
        return position

    def describe(self, step: int, epoch: int) -> list[list[dict[str, Any]]]:
        """Each row of this rank's batch at global ``step`` of ``epoch`` (steps before a resume at another topology or
        seq_len as they ran: fastload.text.token_rows.TokenRows.batch_at): its segments, each named by shard, document,
        first token in the document and length; of a mixture, also the members' weights in force at the row (``"weights"``,
        in the members' order)."""
        rank, world = self.ranks()
        found = self.rows.batch_at(epoch, step, self.state.resumed_from(epoch), self.options.batch_size, rank, world)
        if found is None:
            return []
        first, count, cursor = found.work
        segments = self.rows.segments(epoch, first, count, cursor, found.seq_len)
        out: list[list[dict[str, Any]]] = [[] for _ in range(found.batch_size)]
        for start, length, row in zip(segments.start.tolist(), segments.length.tolist(), segments.row.tolist()):
            segment: dict[str, Any] = {**self.corpus.named(start), "tokens": length}
            if isinstance(rows := self.rows.of(epoch), MixtureRows):
                segment["weights"] = list(rows.weights_at(first + row))
            out[row].append(segment)
        return out

    def close(self) -> None:
        """Stop the workers and close this process's shard files."""
        self.engine.close()
        self.sharded.close()
