"""``fastload.TokenDataLoader`` (what ``fastload.DataLoader(tokens, seq_len=L, ...)`` makes): batches
of packed token rows from a token dataset or a mixture of them by tokens.

The API follows how the training loops consume batches: it is a ``torch.utils.data.DataLoader``
(Lightning and Accelerate's ``prepare`` keep it, as they keep fastload.DataLoader), it yields a
dict of tensors named as Hugging Face models take them (``Trainer`` passes the dict to the model,
as a torchtitan-style loop splits it into inputs and ``labels``), and ``state_dict()`` /
``load_state_dict()`` resume it exactly (Accelerate's ``save_state``, torchtitan's Stateful
checkpoints, Lightning's loop state).

Every global step is ``world_size * batch_size`` rows of the epoch's row sequence (fastload.loading.
token_rows), rank r taking the r-th ``batch_size`` of them, and the epoch's last, partial step its
rows split evenly over the ranks; rows past the epoch's end are padding (every rank makes the same
number of steps, and a rank's batch is all padding only when fewer rows than ranks are left). So a step's batch is a pure function of (seed,
epoch, step, rank, world size), the state is (epoch, rows consumed) plus, for best-fit, where its
packing got to, and a resume at another world size continues with the rows not yet consumed (at
another seq_len too, but for a mixture's rows: fastload.text.token_rows' origin).
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from fastload._util.dist import check_ranks_agree, resolve_rank_world
from fastload.backends.cpu.token_epoch import TokenEpoch, TokenEpochInputs, TokenWorkers
from fastload.loading.frameworks import KeptByAccelerate
from fastload.loading.options import LoaderOptions
from fastload.loading.samplers import LoaderBatchSampler, LoaderSampler
from fastload.loading.state import LoaderState, OrderSettings, read_state_dict, state_number
from fastload.loading.stats import LoaderStats
from fastload.storage.dataset import ShardedDataset
from fastload.storage.mixture import MixedDataset
from fastload.text.epoch_rows import MixtureRows
from fastload.text.token_batch import Attention, BatchFiller, BatchFormat
from fastload.text.token_rows import (
    BLOCK_TOKENS,
    IGNORE_INDEX,
    PACKING_WINDOW,
    Cursor,
    Packing,
    TokenOptions,
    TokenRows,
    choice,
    read_cursor,
)
from fastload.text.token_samplers import TokenBatchIndices, TokenBatchRequest, token_collate


class TokenDataLoader(KeptByAccelerate, torch.utils.data.DataLoader):
    """Packed rows of ``seq_len`` tokens, ``batch_size`` a batch; see the module docstring.

    ``packing``: ``"concat"`` (the shuffled stream cut into rows, no padding), ``"best-fit"``
    (documents packed by best-fit decreasing within each window of ``packing_window`` tokens of
    the stream, long ones split) or
    ``"pad"`` (a document a row, cut or padded to ``seq_len``). ``dataset``: a token dataset's
    folder, URL or ``fastload.open``, or ``fastload.mix({...}, by="tokens")`` (concat rows).
    ``batch_format``: ``"next-token"`` (labels are the next tokens; with ``attention_mask``,
    ``cu_seqlens``, ``max_seqlen``) or ``"transformers"`` (labels lined up with ``input_ids``, as a
    Hugging Face model shifts them itself, and no attention mask); fastload.text.token_batch. ``attention``: what the batch adds so
    that the model's attention keeps a row's documents apart: ``"block-causal"`` (eager, SDPA: a
    (B, 1, L, L) additive ``attention_mask``) or ``"varlen"`` (flash-attention: ``cu_seq_lens_q/k``
    and ``max_length_q/k``, transformers' names; no ``attention_mask``). ``num_workers`` processes make
    the batches (``prefetch_factor`` each ahead) into shared memory, handed out without a copy;
    with 0 the training process makes them.
    """

    use_stateful_dataloader = True  # Accelerate's save_state/load_state then save and load state_dict()

    def __init__(self, dataset: Any, batch_size: int = 1, shuffle: bool | None = True, num_workers: int = 0, drop_last: bool = False,
                 *, seq_len: int, packing: str = "concat", seed: int = 0, rank: int | None = None, world_size: int | None = None,
                 device: str | torch.device | None = None, block_tokens: int = BLOCK_TOKENS, ignore_index: int = IGNORE_INDEX,
                 packing_window: int = PACKING_WINDOW, batch_format: str = "next-token", attention: str | None = None, prefetch_factor: int | None = None, pin_memory: bool = False,
                 timeout: float = 0, worker_init_fn: Any = None, persistent_workers: bool = False) -> None:
        sharded = dataset if isinstance(dataset, ShardedDataset) else ShardedDataset(dataset)
        self.tokens = TokenOptions(seq_len, packing, block_tokens, ignore_index, packing_window)  # type: ignore[arg-type]  # checked there
        self.options = LoaderOptions(batch_size=batch_size, shuffle=bool(shuffle), num_workers=num_workers, drop_last=drop_last, seed=seed,
                                     rank=rank, world_size=world_size, prefetch_factor=prefetch_factor, pin_memory=pin_memory,
                                     timeout=timeout, worker_init_fn=worker_init_fn, persistent_workers=persistent_workers,
                                     device=torch.device(device) if device is not None else None)
        self.rows = TokenRows(sharded, self.tokens, seed, bool(shuffle))
        self.corpus = self.rows.corpus
        self.mixture = sharded if isinstance(sharded, MixedDataset) else None
        tokenizer = self.corpus.tokenizer
        self.pad_id = next(i for i in (tokenizer.pad_id, tokenizer.eos_id, 0) if i is not None)
        self.filler = BatchFiller(self.corpus, self.tokens.seq_len, self.pad_id, self.tokens.ignore_index, choice(BatchFormat, batch_format, "batch_format"),
                                  None if attention is None else choice(Attention, attention, "attention"))
        # torch's names, with torch's meanings (frameworks read them)
        self.dataset, self.sharded = sharded, sharded  # type: ignore[assignment]  # torch annotates a map-style Dataset
        self.batch_size, self.drop_last, self.num_workers, self.seed = batch_size, drop_last, num_workers, seed
        self.shuffle, self.device, self.seq_len = bool(shuffle), self.options.device, self.tokens.seq_len
        self.sampler = LoaderSampler(weakref.proxy(self))  # the views refer to this loader weakly
        self.batch_sampler = LoaderBatchSampler(weakref.proxy(self))
        self.collate_fn = token_collate
        self.pin_memory, self.timeout, self.prefetch_factor = self.options.pin_memory, timeout, self.options.prefetch_factor
        self.persistent_workers, self.worker_init_fn = persistent_workers, worker_init_fn
        self.generator, self.multiprocessing_context, self.in_order = None, None, True
        self.state = LoaderState()
        self.stats = LoaderStats()
        self._engine = TokenWorkers()
        self._active: weakref.ref[TokenEpoch] | None = None
        self._agreed = False
        self._accelerate = False

    # the surface torch's loader and the frameworks read --------------------------------------------

    @property
    def rank(self) -> int:
        """This process's rank, resolved like :meth:`ranks`."""
        return self.ranks()[0]

    @property
    def world_size(self) -> int:
        """The number of ranks sharing the dataset, resolved like :meth:`ranks`."""
        return self.ranks()[1]

    def ranks(self) -> tuple[int, int]:
        """(rank, world size), resolved when asked (rank=/world_size=, the process group, the launcher's environment)."""
        return resolve_rank_world(self.options.rank, self.options.world_size)

    def __len__(self) -> int:
        """This rank's steps in the upcoming epoch from its start (best-fit: every block counted, once per loader)."""
        position = self.state.upcoming()
        total = self.rows.length(position.epoch, self.rows.origin(position.resumed_from))
        step = self.options.batch_size * self.ranks()[1]
        return total // step if self.drop_last else -(-total // step)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:  # type: ignore[override]
        previous = self._active() if self._active is not None else None
        if previous is not None:
            previous.close()
        inputs = TokenEpochInputs(self.sharded, self.rows, self.filler, self.options, self.device, self.state, self.stats,
                                  self._accelerate, self._check_agree, self.ranks)
        epoch = self._engine.epoch(inputs)
        self._active = weakref.ref(epoch)
        return epoch

    def upcoming_batches(self, from_start: bool) -> list[TokenBatchIndices]:
        """This rank's batches of the upcoming epoch (from its start, or from a loaded state's
        position) as row numbers: what ``loader.sampler`` and ``loader.batch_sampler`` yield."""
        position = self.state.upcoming()
        epoch, first = position.epoch, 0 if from_start else position.consumed
        origin = None if from_start else self.rows.origin(position.resumed_from)
        rank, world = self.ranks()
        batch = self.options.batch_size
        batches = []
        while self.rows.holds_step(epoch, first, batch * world, self.drop_last, origin):
            mine, count = self.rows.rank_rows(epoch, first, batch, rank, world, origin)
            request = TokenBatchRequest(self.tokens, self.filler.format, self.filler.attention, self.seed, self.shuffle, self.pad_id, epoch, mine,
                                        self.rows.locate(epoch, mine, origin), batch)
            batches.append(TokenBatchIndices(range(mine, mine + count), request))
            first += batch * world
        return batches

    def set_epoch(self, epoch: int) -> None:
        """The next iteration yields ``epoch`` from its start (as torch's DistributedSampler.set_epoch);
        the epoch a loaded state is in keeps its position, the one it finished yields nothing more."""
        self._settle_abandoned()
        self.state.set_epoch(int(epoch), self.rows.length)

    def _settle_abandoned(self) -> None:
        """Close an epoch left in progress (a break) before the caller sets another position."""
        active = self._active() if self._active is not None else None
        if active is not None and active.started and not active.finished:
            active.close()

    @property
    def identity(self) -> str:
        """A digest of the tokens this loader reads and how it packs them (recorded in state_dict)."""
        return self._identity(self.tokens.seq_len)

    def _identity(self, seq_len: int) -> str:
        """:attr:`identity` as a loader of rows of ``seq_len`` tokens has it (a state saved at another seq_len names that one)."""
        digest = hashlib.sha256()
        for shard in self.sharded.index.shards:
            digest.update(f"{shard.path}|{shard.tokens}|{shard.sha256};".encode())
        options = self.tokens
        digest.update(f"{seq_len}|{options.packing.value}|{options.block_tokens}".encode())
        if options.packing is Packing.BEST_FIT:
            digest.update(f"|{options.window_blocks}".encode())
        if self.mixture is not None:
            digest.update(f"mix{self.mixture.weights}".encode())
            if self.mixture.schedule is not None:  # it decides the rows' members as the weights do
                digest.update(f"{self.mixture.schedule.as_dict()}".encode())
        return digest.hexdigest()[:16]

    def _row_settings(self) -> dict[str, Any]:
        """What cuts the stream into rows, by argument name (the part of :attr:`identity` a user sets)."""
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
        return OrderSettings(False, self.shuffle, 1)

    def state_dict(self) -> dict[str, Any]:
        """Where training is: (seed, epoch, rows consumed), the topology, and for best-fit the window
        holding the next row with that window's first row (so a resume counts on from there)."""
        state = self.state.state_dict(self.seed, self.identity, (self.ranks()[1], self.options.batch_size), self._settings())
        position = self.state.position
        cursor = self.rows.packing_cursor(position.epoch, position.consumed, position.resumed_from)
        if cursor is not None:
            state["packing_cursor"] = cursor
        state["rows"] = self._row_settings()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration yields the rows of that epoch not yet consumed, at any world size
        and batch size, and but for a mixture at any seq_len too (concat from the stream's token the saved rows
        ended at, pad from the next document, best-fit from the pieces of the saved window its rows did not hold;
        the rest cut as they were saved: packing, block_tokens, window)."""
        saved_len = self._check_rows(state)
        cursor = state.get("packing_cursor")
        position = read_state_dict(state, self.seed, self._identity(saved_len), (self.ranks()[1], self.options.batch_size), self._settings(),
                                   lambda p: self.rows.resume_rows(p.epoch, p.consumed, cursor, self.rows.origin(p.resumed_from)), "rows",
                                   (saved_len, self.tokens.seq_len), None if cursor is None else read_cursor(cursor))
        self._settle_abandoned()
        self.state.restore(position)

    def _first_row(self, step: int, epoch: int) -> tuple[int, int, int, int, Cursor | None] | None:
        """(first row, rows, batch size, seq_len, concat's origin) of this rank's batch at global ``step`` of ``epoch``: steps
        run before a resume at another topology or seq_len as they ran (None where this rank did not exist)."""
        rank, world = self.ranks()
        steps_before, rows_before = 0, 0
        resumed_from = self.state.resumed_from(epoch)
        cuts = self.rows.cuts(resumed_from)
        origin = cuts[-1][1]
        for (saved_world, saved_batch, consumed, *_), (seq_len, cut) in zip(resumed_from, cuts):
            steps = -(-(consumed - rows_before) // (saved_world * saved_batch))
            if step < steps_before + steps:
                if rank >= saved_world:
                    return None
                step_first = rows_before + (step - steps_before) * saved_world * saved_batch
                return (*self.rows.rank_rows(epoch, step_first, saved_batch, rank, saved_world, origin), saved_batch, seq_len, cut)
            steps_before, rows_before = steps_before + steps, consumed
        batch = self.options.batch_size
        step_first = rows_before + (step - steps_before) * world * batch
        return (*self.rows.rank_rows(epoch, step_first, batch, rank, world, origin), batch, self.tokens.seq_len, origin)

    def describe(self, step: int, epoch: int | None = None) -> list[list[dict[str, Any]]]:
        """This rank's batch at global ``step`` of ``epoch`` (default: the one being or last iterated, else the next; steps before a
        resume at another topology or seq_len as they ran): each row's segments, each named by its shard,
        document number, first token in the document and length; of a mixture, also the members'
        weights in force at the row (``"weights"``, in the members' order)."""
        epoch = self.state.current_epoch if epoch is None else int(epoch)
        found = self._first_row(int(step), epoch)
        if found is None:
            return []
        first, count, batch, seq_len, origin = found
        if seq_len == self.tokens.seq_len:
            segments = self.rows.segments(epoch, first, count, self.rows.locate(epoch, first, origin))
        else:
            segments = self.rows.cut_at(epoch, first, count, seq_len, origin)
        out: list[list[dict[str, Any]]] = [[] for _ in range(batch)]
        for start, length, row in zip(segments.start.tolist(), segments.length.tolist(), segments.row.tolist()):
            shard, document = self.corpus.where(start)
            offset = start - self.corpus.document_start(shard, document)
            segment: dict[str, Any] = {"shard": self.sharded.shard_name(shard), "document": document, "offset": offset, "tokens": length}
            if isinstance(rows := self.rows.of(epoch), MixtureRows):
                segment["weights"] = list(rows.weights_at(first + row))
            out[row].append(segment)
        return out

    def _check_agree(self) -> None:
        if not self._agreed:
            check_ranks_agree({"seed": self.seed, "batch_size": self.options.batch_size, "seq_len": self.tokens.seq_len,
                               "world_size": self.ranks()[1], "dataset (its identity digest)": int(self.identity[:15], 16)},
                              "fastload.TokenDataLoader")
            self._agreed = True

    def close(self) -> None:
        """End the iteration under way, stop the workers and close this process's shard files."""
        active = self._active() if self._active is not None else None
        if active is not None:
            active.close()
        self._active = None
        self._engine.close()
        self.sharded.close()

    def __enter__(self) -> TokenDataLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
