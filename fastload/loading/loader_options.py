"""``fastload.DataLoader``'s arguments for a converted dataset, validated once, in one frozen dataclass
(as :class:`fastload.converters.convert_options.ConvertOptions` does for conversion)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any, Literal, get_args

import numpy as np
import torch
from torch.utils.data.distributed import DistributedSampler

from fastload._util.dist import resolve_rank_world
from fastload.errors import DEFAULT_MAX_SKIPPED, OnError, check_max_skipped, check_on_error
from fastload.loading.samplers import adopt_sampler
from fastload.loading.torchvision_translation import TorchvisionSteps, is_torchvision_pipeline, translate
from fastload.media import MEDIA_ROLES, media_role_of
from fastload.transforms import Transform, validate

Backend = Literal["auto", "cpu", "dali", "hybrid"]
BACKENDS: tuple[str, ...] = get_args(Backend)
REMOTE_SHUFFLE_BUFFER = 4096  # the streaming order's buffer for a remote dataset without shuffle_buffer=
TORCH_ONLY = ("batch_sampler", "generator")  # torch's arguments the fast path refuses


def fast_path_only(default: Any) -> Any:
    """A field for an argument torch's DataLoader does not have (refused with a torch Dataset)."""
    return field(default=default, metadata={"fast_path_only": True})


@dataclass(frozen=True)
class LoaderOptions:
    """What a fast-path loader was asked for, checked once. Torch's arguments come first, then
    fastload's own, then what ``sampler=`` and a ``Subset`` select (:meth:`from_arguments`).

    To add an argument: a field here (with :func:`fast_path_only` when torch has none), its check
    in ``__post_init__``, and the keyword in ``fastload.DataLoader.__init__``, passed on by name.
    """

    batch_size: int = 1  # None (torch's unbatched loading) is refused here
    shuffle: bool = False
    num_workers: int = 0
    pin_memory: bool = False  # True only where CUDA is available (nothing to pin for otherwise)
    drop_last: bool = False
    timeout: float = 0
    worker_init_fn: Callable[[int], None] | None = None
    collate_fn: Callable[[list], Any] | None = None  # None: batches stacked in shared memory; else applied to their samples
    prefetch_factor: int | None = None  # torch's values: 2 with workers, None without
    persistent_workers: bool = False  # workers always live as long as the loader
    seed: int = 0
    # given: None, a sequence of specs or a torchvision pipeline; stored: the validated tuple of specs
    transform: tuple[Transform, ...] = fast_path_only(None)
    backend: Backend = fast_path_only("auto")
    device: torch.device | None = fast_path_only(None)  # a str is accepted too; stored as a torch.device
    on_error: OnError = fast_path_only("raise")
    max_skipped: int | float | None = fast_path_only(DEFAULT_MAX_SKIPPED)  # on_error="skip"'s budget an epoch (fastload.errors.skip_allowance)
    return_keys: bool = fast_path_only(False)
    rank: int | None = fast_path_only(None)
    world_size: int | None = fast_path_only(None)
    evaluation: bool = fast_path_only(False)
    shuffle_buffer: int | None = fast_path_only(None)
    hw_decoder_load: float = fast_path_only(0.65)
    fields: Sequence[str] | Mapping[str, str] | None = fast_path_only(None)  # which fields, in what order (fastload.fields)
    map: Callable[[dict, np.random.Generator], dict] | None = fast_path_only(None)  # user code per decoded sample
    batch_map: Callable[[Any, torch.Generator], Any] | None = fast_path_only(None)  # user code per batch, on device
    # given: keys or a path of a key file; stored: their sample indices, sorted (fastload.loading.loader_orders.excluded_indices)
    exclude: tuple[int, ...] | None = fast_path_only(None)
    class_weights: Mapping[str | int, float] | None = fast_path_only(None)  # class name or label -> share (fastload.orders.balanced)
    balanced: bool = fast_path_only(False)  # every class an equal share of each epoch
    # media role -> its sampling (fastload.media: video's clip=, audio's audio=; read as options.clip, options.audio); stored
    # with each sampling decided
    media: Mapping[str, Any] = field(default_factory=dict)
    take: tuple[int, ...] | None = None  # the sample indices a Subset / SubsetRandomSampler selects
    drop_remainder: bool = False  # as DistributedSampler(drop_last=True)
    distributed: DistributedSampler | None = None  # a sampler= whose set_epoch the loader follows
    remote: bool = False  # the dataset is a URL, or data read in place: always the streaming order
    stream_buffer: int | None = None  # the streaming order's buffer without shuffle_buffer= (ShardedDataset.shuffle_window; None: REMOTE_SHUFFLE_BUFFER)
    torchvision_steps: TorchvisionSteps | None = None  # what of a torchvision transform= torchvision still runs (set here)

    def __post_init__(self) -> None:
        if self.batch_size is None or self.batch_size < 1:
            raise ValueError("a fastload dataset needs batch_size >= 1")
        if self.num_workers < 0:
            raise ValueError("num_workers must be >= 0")
        if self.prefetch_factor is not None and self.num_workers == 0:
            raise ValueError("prefetch_factor needs num_workers > 0 (as in torch)")
        if self.evaluation and self.drop_last:
            raise ValueError("evaluation=True yields every sample exactly once: it cannot drop_last")
        if self.shuffle_buffer is not None and (not self.shuffle or self.shuffle_buffer < 1):
            raise ValueError("shuffle_buffer= (streaming order) needs shuffle=True and a size >= 1")
        if self.streaming and self.take is not None:
            raise ValueError("a Subset (or SubsetRandomSampler) picks samples across shards: not with the streaming "
                             "order (remote datasets, shuffle_buffer=), which reads whole shards")
        if self.balanced or self.class_weights is not None:
            self._check_class_weights()
        if not 0 <= self.hw_decoder_load <= 1:
            raise ValueError("hw_decoder_load is a share of images, between 0 and 1")
        check_on_error(self.on_error)
        check_max_skipped(self.max_skipped)
        if is_torchvision_pipeline(self.transform):
            translation = translate(self.transform)  # logs the steps left to torchvision
            object.__setattr__(self, "transform", translation.specs)
            object.__setattr__(self, "torchvision_steps", translation.rest)
        object.__setattr__(self, "transform", validate(self.transform))
        if self.collate_fn is not None and not callable(self.collate_fn):
            raise TypeError(f"collate_fn= must be a callable (list of samples) -> batch, got {self.collate_fn!r}")
        if self.batch_map is not None and not callable(self.batch_map):
            raise TypeError(f"batch_map= must be a callable (batch, torch.Generator) -> batch, got {self.batch_map!r}")
        if self.map is not None and not callable(self.map):
            raise TypeError(f"map= must be a callable (sample: dict, rng: numpy.random.Generator) -> dict, got {self.map!r}")
        if self.rank is not None and self.world_size is not None:
            resolve_rank_world(self.rank, self.world_size)  # refuse an impossible pair now
        media = {role: self._sampling(role, sampling) for role, sampling in self.media.items()}
        object.__setattr__(self, "media", {role: MEDIA_ROLES[role].option.join(sampling, media) for role, sampling in media.items()})
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.backend == "hybrid" and self.num_workers == 0:
            raise ValueError("backend='hybrid' splits each batch between the CPU workers and DALI: it needs num_workers >= 1")
        object.__setattr__(self, "pin_memory", self.pin_memory and torch.cuda.is_available())
        prefetch = (2 if self.prefetch_factor is None else self.prefetch_factor) if self.num_workers else None
        object.__setattr__(self, "prefetch_factor", prefetch)
        object.__setattr__(self, "device", torch.device(self.device) if self.device is not None else None)

    def _sampling(self, role: str, sampling: Any) -> Any:
        """Media ``role``'s sampling checked (its class, with the other options) and its sampling decided."""
        option = MEDIA_ROLES[role].option
        if not isinstance(sampling, option.spec):
            raise TypeError(f"{option.keyword}= takes a fastload.{option.spec.__name__}, got {type(sampling).__name__}")
        option.check(sampling, self.on_error)
        return sampling.resolved(self.shuffle and not self.evaluation)

    def __getattr__(self, name: str) -> Any:
        """A media role's sampling by its keyword (``options.clip``, ``options.audio``; None: not given)."""
        role = media_role_of(name) if not name.startswith("_") and name != "media" else None
        if role is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return self.media.get(role)

    def _check_class_weights(self) -> None:
        if self.balanced and self.class_weights is not None:
            raise ValueError("give class_weights= or balanced=True, not both")
        if self.class_weights is not None and not isinstance(self.class_weights, Mapping):
            raise TypeError(f"class_weights= maps class names or labels to weights, got {type(self.class_weights).__name__}")
        if not self.shuffle or self.evaluation or self.streaming:
            raise ValueError("class_weights= / balanced=True draw classes at random: they need shuffle=True, "
                             "and neither evaluation=True nor the streaming order (shuffle_buffer=, remote datasets)")

    @classmethod
    def from_arguments(
        cls, dataset_size: int, subset: np.ndarray | None, remote: bool, *, sampler: Any, batch_sampler: Any,
        generator: Any, shuffle: bool | None, seed: int, rank: int | None, world_size: int | None,
        **arguments: Any,
    ) -> LoaderOptions:
        """The options of ``fastload.DataLoader(dataset, **arguments)``: ``sampler=`` resolved into
        shuffle, seed, rank, world size and a selection (after ``subset``, a Subset's indices)."""
        for name, value in zip(TORCH_ONLY, (batch_sampler, generator), strict=True):
            if value is not None:
                raise ValueError(
                    f"{name}= is not used with a fastload dataset: order comes from shuffle/seed/rank "
                    f"(so it can resume exactly)"
                )
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle (as in torch)")
        choice = adopt_sampler(sampler, dataset_size)
        if choice.take is not None:
            subset = choice.take if subset is None else subset[choice.take]
        if choice.seed is not None and seed not in (0, choice.seed):
            raise ValueError(f"seed={seed} and the sampler's seed={choice.seed} differ: give one of them")
        return cls(
            shuffle=bool(shuffle if choice.shuffle is None else choice.shuffle),
            seed=seed if choice.seed is None else choice.seed,
            rank=choice.rank if rank is None else rank,  # rank=/world_size= win over a DistributedSampler's
            world_size=choice.world_size if world_size is None else world_size,
            take=None if subset is None else tuple(subset.tolist()),
            drop_remainder=choice.drop_remainder,
            distributed=choice.distributed,
            remote=remote,
            **arguments,
        )

    @property
    def streaming(self) -> bool:
        """Whether the streaming order is used: shuffle_buffer= given, or a remote dataset."""
        return self.shuffle_buffer is not None or self.remote

    @property
    def buffer_size(self) -> int:
        """The streaming order's shuffle buffer (1: in shard order, without shuffling)."""
        return (self.shuffle_buffer or self.stream_buffer or REMOTE_SHUFFLE_BUFFER) if self.shuffle else 1


def fast_path_defaults() -> dict[str, Any]:
    """fastload's own arguments and their defaults: a torch Dataset's loader accepts only these values
    (each media role's keyword among them: ``clip``, ``audio``)."""
    defaults = {f.name: f.default for f in dataclass_fields(LoaderOptions) if f.metadata.get("fast_path_only")}
    return {**defaults, **{media.keyword: None for media in MEDIA_ROLES.values()}}
