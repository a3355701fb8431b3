"""``fastload.DataLoader``: a drop-in for ``torch.utils.data.DataLoader``.

Given any torch Dataset it *is* torch's DataLoader (same arguments, same batches; fastload.loading.torch_mode).
Given a converted dataset (or its path) it takes the fast path, in one of the kinds of batch of
fastload.batch_kinds: samples with their fields (images, clips: workers read bytes by offset, decode
with libjpeg-turbo at the smallest sufficient DCT scale or with DALI, transform, and write pixels into
shared memory) or, with ``seq_len=``, packed token rows. The main process keeps ``prefetch_factor``
batches in flight per worker, pins and moves batches to ``device``.

The loader is its stages: options validated once (fastload.loading.loader_options), one training position
(fastload.loading.state) and its stats, the kind of batch that counts, makes and describes its
epochs, each starting at the state's position and advancing it.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from fastload._util.dist import check_ranks_agree
from fastload.av.clips import Clip
from fastload.av.crops import Audio
from fastload.batch_kinds.batch_kind import BatchKind
from fastload.batch_kinds.sample_batches import SampleBatches
from fastload.batch_kinds.token_batches import TokenBatches
from fastload.errors import DEFAULT_MAX_SKIPPED
from fastload.loading.epoch import EpochLifecycle
from fastload.loading.frameworks import KeptByAccelerate, accelerate_device
from fastload.loading.loader_options import LoaderOptions, fast_path_defaults
from fastload.loading.loader_orders import excluded_indices
from fastload.loading.samplers import LoaderBatchSampler, LoaderSampler, unwrap_subset
from fastload.loading.state import LoaderState
from fastload.loading.stats import LoaderStats
from fastload.loading.torch_mode import TorchMode
from fastload.media import MEDIA_ROLES, media_arguments
from fastload.storage.dataset import ShardedDataset
from fastload.text.token_rows import BLOCK_TOKENS, IGNORE_INDEX, PACKING_WINDOW, TokenOptions
from fastload.transforms import Transform

TOKEN_DEFAULTS = {"packing": "concat", "block_tokens": BLOCK_TOKENS, "ignore_index": IGNORE_INDEX,
                  "packing_window": PACKING_WINDOW, "batch_format": "next-token", "attention": None, "tokenizer": None}
SAMPLE_ONLY = ("sampler", "batch_sampler", "generator", "collate_fn")  # beside fast_path_defaults(): what token rows refuse


def is_fastload_dataset(dataset: Any) -> bool:
    """Whether ``dataset`` takes the fast path: a converted dataset, its path, or a Subset of one."""
    return isinstance(dataset, (str, os.PathLike)) or unwrap_subset(dataset)[0] is not None


def check_kind_arguments(given: Mapping[str, Any], seq_len: int | None) -> None:
    """Refuse arguments of the other kind of batch: token-row settings without ``seq_len=``, and
    with it what applies to samples only (transforms, fields, samplers, backends...)."""
    if seq_len is None:
        stray = [name for name, default in TOKEN_DEFAULTS.items() if given[name] != default]
        if stray:
            raise ValueError(f"{', '.join(f'{name}=' for name in stray)} set how token rows are packed: give seq_len= "
                             "(the tokens a row) to load a token dataset's packed rows")
        return
    defaults = {name: default for name, default in fast_path_defaults().items() if name not in ("rank", "world_size", "device", "fields")}
    stray = [name for name in SAMPLE_ONLY if given[name] is not None]
    stray += [name for name, default in defaults.items() if given[name] is not default and given[name] != default]
    if stray:
        raise ValueError(f"seq_len= loads packed token rows: {', '.join(f'{name}=' for name in stray)} apply to samples "
                         "(images, fields, clips) and are not used here")


def token_field(fields: object) -> str | None:
    """The one column ``fields=`` names for token rows (data read in place: each row's token ids or text), or None."""
    if fields is None:
        return None
    if isinstance(fields, (list, tuple)) and len(fields) == 1 and isinstance(fields[0], str):
        return fields[0]
    raise ValueError(f"with seq_len=, fields= names the one column holding each row's token ids (or text), as [COLUMN]: got {fields!r}")


class DataLoader(KeptByAccelerate, torch.utils.data.DataLoader):
    """Batches from a dataset; see the module docstring. Arguments before ``*`` are torch's.

    It is a ``torch.utils.data.DataLoader`` (Lightning and Accelerate treat it as one) with torch's
    attributes: ``dataset``, ``batch_size``, ``drop_last``, ``sampler`` (a DistributedSampler of
    this rank's indices whose ``set_epoch`` is the loader's), ``batch_sampler``. ``sampler=`` takes a
    DistributedSampler (rank, world size, shuffle, seed and drop_last come from it; its set_epoch
    takes effect), a Random/Sequential/SubsetRandomSampler; ``dataset`` may be a ``Subset`` of a
    fastload dataset. Rank and world size are resolved when iteration starts.

    fastload's own: ``transform`` (specs from fastload.transforms, or a torchvision Compose, translated by
    fastload.loading.torchvision_translation), ``backend`` ("auto": by measurement, fastload.backends.choice; "cpu";
    "dali"; "hybrid": each batch split between DALI and the CPU workers), ``device``,
    ``seed``, ``on_error`` ("raise" | "skip"), ``max_skipped`` (with "skip": at most this many samples
    skipped an epoch, an int, or this share of the rank's epoch, a float; None: no limit), ``return_keys``, ``rank``/``world_size``,
    ``evaluation`` (every sample once across ranks, padding marked by a ``valid`` tensor),
    ``shuffle_buffer`` (streaming order: each rank reads its own shuffled shards in sequence
    through a buffer; always used for remote datasets, with ``options.REMOTE_SHUFFLE_BUFFER`` by default) and
    ``hw_decoder_load`` (with DALI on a GPU: the share of JPEGs sent to the hardware decoder),
    ``exclude`` (keys, or a file of one key per line, left out of every epoch) and
    ``class_weights`` / ``balanced`` (each class's share of an epoch; fastload.orders.balanced).

    Token datasets: ``seq_len=`` makes batches of packed rows of ``seq_len`` tokens (shuffled by
    default), a dict of tensors named as Hugging Face models take them. ``packing``: ``"concat"``
    (the shuffled stream cut into rows), ``"best-fit"`` (documents packed by best-fit decreasing within
    each window of ``packing_window`` tokens, long ones split) or ``"pad"`` (a document a row, cut or
    padded); ``batch_format``: ``"next-token"`` (labels are the next tokens; with ``attention_mask``,
    ``cu_seqlens``, ``max_seqlen``) or ``"transformers"`` (labels lined up with ``input_ids``);
    ``attention``: ``"block-causal"`` (a (B, 1, L, L) additive mask) or ``"varlen"``
    (flash-attention's ``cu_seq_lens_q/k``, ``max_length_q/k``) keeps a row's documents apart;
    ``ignore_index`` marks labels not trained on; ``block_tokens`` is the shuffle's unit
    (fastload.text.token_batch, fastload.text.token_rows). Data read in place (Parquet, Arrow, Lance) gives
    each row's token ids, or its text, from the column ``fields=[COLUMN]`` names (default ``input_ids``);
    ``tokenizer`` (a tokenizer.json or folder) names their tokenizer: its pad and eos ids, the vocabulary
    ids are checked against; it encodes a text column (fastload.text.column_corpus).
    """

    use_stateful_dataloader = True  # Accelerate's save_state/load_state then save and load state_dict()

    def __new__(cls, dataset: Any = None, *args: Any, **kwargs: Any) -> DataLoader:
        if cls is DataLoader and not is_fastload_dataset(dataset):
            return super().__new__(TorchDatasetLoader)
        return super().__new__(cls)

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Callable | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        generator: torch.Generator | None = None,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        *,
        transform: Sequence[Transform] | Any = None,
        backend: str = "auto",
        device: str | torch.device | None = None,
        seed: int = 0,
        on_error: str = "raise",
        max_skipped: int | float | None = DEFAULT_MAX_SKIPPED,
        return_keys: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        evaluation: bool = False,
        shuffle_buffer: int | None = None,
        hw_decoder_load: float = 0.65,
        fields: Sequence[str] | Mapping[str, str] | None = None,
        map: Callable[[dict, np.random.Generator], dict] | None = None,
        batch_map: Callable[[Any, torch.Generator], Any] | None = None,
        exclude: Sequence[str] | str | os.PathLike[str] | None = None,
        class_weights: Mapping[str | int, float] | None = None,
        balanced: bool = False,
        clip: Clip | None = None,
        audio: Audio | None = None,
        seq_len: int | None = None,
        packing: str = "concat",
        block_tokens: int = BLOCK_TOKENS,
        ignore_index: int = IGNORE_INDEX,
        packing_window: int = PACKING_WINDOW,
        batch_format: str = "next-token",
        attention: str | None = None,
        tokenizer: str | os.PathLike[str] | None = None,
    ) -> None:
        given = {name: value for name, value in locals().items() if name not in ("self", "dataset")}
        check_kind_arguments(given, seq_len)
        self.stats, self.seq_len = LoaderStats(), seq_len
        kind: BatchKind
        if seq_len is not None:
            if batch_size is None:
                raise ValueError("seq_len= makes batches of packed rows: batch_size must be >= 1, not None")
            sharded = dataset if isinstance(dataset, ShardedDataset) else ShardedDataset(dataset)
            self.dataset = sharded  # type: ignore[assignment]  # torch annotates a map-style Dataset
            options = LoaderOptions(batch_size=batch_size, shuffle=True if shuffle is None else bool(shuffle), num_workers=num_workers,
                                    drop_last=drop_last, seed=seed, rank=rank, world_size=world_size, prefetch_factor=prefetch_factor,
                                    pin_memory=pin_memory, timeout=timeout, worker_init_fn=worker_init_fn,
                                    persistent_workers=persistent_workers, device=device)  # type: ignore[arg-type]  # checked there
            tokens = TokenOptions(seq_len, packing, block_tokens, ignore_index, packing_window, token_field(fields),  # type: ignore[arg-type]
                                  None if tokenizer is None else os.fspath(tokenizer))  # checked there
            self.state = LoaderState()
            kind = TokenBatches(sharded, tokens, options, self.state, self.stats, batch_format, attention)
        else:
            if isinstance(dataset, (str, os.PathLike)):
                dataset = ShardedDataset(dataset)
            self.dataset = dataset
            found, subset = unwrap_subset(dataset)
            assert found is not None  # __new__ sent every other dataset to torch_mode
            sharded = found
            options = LoaderOptions.from_arguments(
                len(dataset), subset, sharded.streams, sampler=sampler, batch_sampler=batch_sampler,
                generator=generator, shuffle=shuffle, seed=seed, rank=rank, world_size=world_size,
                batch_size=batch_size, num_workers=num_workers, pin_memory=pin_memory, drop_last=drop_last, timeout=timeout,
                worker_init_fn=worker_init_fn, collate_fn=collate_fn, prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                transform=transform, backend=backend, device=device, on_error=on_error, max_skipped=max_skipped, return_keys=return_keys,
                evaluation=evaluation, shuffle_buffer=shuffle_buffer, hw_decoder_load=hw_decoder_load, fields=fields, map=map,
                batch_map=batch_map, exclude=excluded_indices(sharded, exclude), class_weights=class_weights, balanced=balanced,
                media=media_arguments(given), stream_buffer=sharded.shuffle_window,
            )
            self.state = LoaderState(options.streaming)
            kind = SampleBatches(sharded, options, self.state, self.stats, self._probe_loader)
        self.options, self.kind, self.sharded = options, kind, sharded
        self.backend = kind.backend
        # torch's names, with torch's meanings (frameworks read them); the views refer to this loader weakly
        self.batch_size, self.drop_last, self.num_workers = options.batch_size, options.drop_last, options.num_workers
        self.pin_memory, self.pin_memory_device, self.timeout = options.pin_memory, "", options.timeout
        self.worker_init_fn, self.prefetch_factor = options.worker_init_fn, options.prefetch_factor
        self.persistent_workers, self.multiprocessing_context = options.persistent_workers, None
        self.generator, self.in_order = None, True
        self.sampler = options.distributed if options.distributed is not None else LoaderSampler(weakref.proxy(self))
        self.batch_sampler = LoaderBatchSampler(weakref.proxy(self))
        self.collate_fn = kind.collate_fn
        self.shuffle, self.seed = options.shuffle, options.seed
        self.device = options.device
        self._sampler_epoch_seen = None if options.distributed is None else options.distributed.epoch
        self._active: weakref.ref[EpochLifecycle] | None = None  # held weakly: an iterator dropped mid-epoch ends it
        self._agreed = False
        self._accelerate = False

    def _probe_loader(self, backend: str) -> DataLoader:
        """A loader like this one on another ``backend=``: what ``auto``'s probe times."""
        options = self.options
        return DataLoader(self.dataset, batch_size=options.batch_size, shuffle=True, num_workers=options.num_workers,
                          transform=options.transform, backend=backend, fields=options.fields, on_error=options.on_error,
                          max_skipped=options.max_skipped, hw_decoder_load=options.hw_decoder_load,
                          **{MEDIA_ROLES[role].keyword: sampling for role, sampling in options.media.items()})

    # --- the torch-compatible surface -----------------------------------------------------------

    @property
    def rank(self) -> int:
        """This process's rank: rank=, a DistributedSampler's, the process group's, the launcher's."""
        return self.kind.ranks()[0]

    @property
    def world_size(self) -> int:
        """The number of ranks sharing the dataset, resolved like :attr:`rank`."""
        return self.kind.ranks()[1]

    def __len__(self) -> int:
        return self.kind.batch_count(self.state.upcoming())

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # torch annotates its own iterator class
        previous = self._active() if self._active is not None else None
        if previous is not None:
            previous.close()
        iterator = self.kind.epoch(self.device, self._accelerate, self._before_epoch)
        self._active = weakref.ref(iterator)
        return iterator

    def upcoming_batches(self, from_start: bool) -> Sequence[list[int]]:
        """This rank's batches of the upcoming epoch (from its start, or from a loaded state's
        position) as sample indices or row numbers: what ``loader.sampler`` and ``loader.batch_sampler`` yield."""
        position = self.state.upcoming()
        if from_start:
            position = replace(position, consumed=0)
        device = self.device if self.device is not None else accelerate_device() if self._accelerate else None
        return self.kind.upcoming_batches(position, device)

    def describe(self, step: int, epoch: int | None = None) -> Any:
        """This rank's batch at ``step`` (counted from the epoch's start) of ``epoch`` (default: the
        one being or last iterated, else the next), read from the indexes (and image headers) only;
        steps run before an elastic resume are described at the topology they ran at. Samples: each
        one's key, index and planned crop, flip and DCT scale (fastload.loading.provenance; with
        on_error="skip" each sample is the one that took the place of a skipped one, ``stands_in_for``
        names those it replaced). Token rows: each row's segments, named by shard, document, first
        token in the document and length (of a mixture, the members' weights in force)."""
        epoch = self.state.current_epoch if epoch is None else int(epoch)
        return self.kind.describe(int(step), epoch)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration yields (it also advances by itself once
        an epoch's batches are all handed out). Setting the epoch a loaded state_dict is in keeps
        that state's position; setting the one it finished (saved after its last batch) yields
        nothing more of it."""
        self._settle_abandoned()
        self.state.set_epoch(int(epoch), self.kind.epoch_length)

    def _settle_abandoned(self) -> None:
        """Close an epoch left in progress (a break) now: closing breaks it off, which must happen
        before the caller sets another position (set_epoch, load_state_dict), not over it."""
        active = self._active() if self._active is not None else None
        if active is not None and active.started and not active.finished:
            active.close()

    @property
    def identity(self) -> str:
        """A digest of what this loader reads (shards, their checksums, a Subset's choice; token rows:
        how they are packed): recorded in state_dict, compared across ranks."""
        return self.kind.identity()

    def _before_epoch(self) -> None:
        """As an epoch starts: a DistributedSampler passed as sampler= has its set_epoch take
        effect, and (once per loader, with a process group) the ranks must agree on the order."""
        sampler = self.options.distributed
        if sampler is not None and sampler.epoch != self._sampler_epoch_seen:
            self._sampler_epoch_seen = sampler.epoch
            self.set_epoch(sampler.epoch)
        if not self._agreed:
            check_ranks_agree(self.kind.agreement(), "fastload.DataLoader")
            self._agreed = True

    def state_dict(self) -> dict[str, Any]:
        """Where training is: only batches handed to the caller count, not prefetched ones."""
        return self.kind.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration yields exactly what of that epoch was not yet consumed, at any
        world size (the streaming order then deals the unseen shards anew; token rows at any batch size too)."""
        position = self.kind.read_state(state)
        self._settle_abandoned()
        self.state.restore(position)

    def close(self) -> None:
        """Stop the workers and release the shared memory (also done as soon as nothing refers to
        the loader or an iterator of it)."""
        active = self._active() if self._active is not None else None
        if active is not None:
            active.close()
        self._active = None
        self.kind.close()

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TorchDatasetLoader(TorchMode, DataLoader):
    """What ``fastload.DataLoader(torch_dataset, ...)`` makes: torch's loader with fastload's surface
    (fastload.loading.torch_mode), and a ``fastload.DataLoader``."""
