"""The training position of a fast-path loader, owned by one :class:`LoaderState`, and the format
of its ``state_dict()``: (seed, epoch, samples consumed), the dataset's identity, the topology
(world size, batch size) and the topologies the epoch was resumed from (what ``loader.describe`` needs to
name the batches of steps run before an elastic resume; the streaming order also re-deals after each)."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from fastload.orders.position import Position, ResumedFrom

STATE_VERSION = 3  # 2: the orders became seeded bijections (fastload.orders.permutation); 3: small permutations uniform, the order's settings recorded
OLDER_ORDERS = {1: "the orders became seeded bijections", 2: "permutations of up to 4096 values became uniform"}


@dataclass(frozen=True)
class OrderSettings:
    """What a position's meaning depends on beside seed and dataset: the order and its shuffling."""

    streaming: bool
    shuffle: bool
    buffer_size: int  # the streaming order's shuffle buffer (1 for the global order)

    def as_state(self) -> dict[str, Any]:
        """The settings as a state_dict records them."""
        return {"order": "streaming" if self.streaming else "global", "shuffle": self.shuffle,
                **({"shuffle_buffer": self.buffer_size} if self.streaming else {})}

class Phase(Enum):
    """Where a loader is between and during iterations."""

    IDLE = "idle"  # the next iteration starts at the position
    RUNNING = "running"  # an iteration is under way; the position follows its batches
    BROKEN_OFF = "broken off"  # an iteration stopped mid-epoch: the position says where, the next one starts over


class LoaderState:
    """A loader's training position: epochs take it when they start, advance it with each batch
    handed out, and finish or break it off; ``state_dict()`` reports it, ``load_state_dict()``
    sets it. Only batches handed to the caller count, never prefetched ones."""

    def __init__(self, streaming: bool = False) -> None:
        self.streaming = streaming  # a restarted epoch keeps the topologies it was resumed from only in the streaming (re-dealt) order
        self.position = Position(0)
        self.phase = Phase.IDLE
        self.loaded = False  # the position is a loaded state's, not iterated nor set since
        self.iterated: int | None = None  # the epoch last iterated, until an epoch is set or a state loaded
        self._finished_resumed_from: dict[int, tuple[ResumedFrom, ...]] = {}  # of epochs finished after an elastic resume

    def resumed_from(self, epoch: int) -> tuple[ResumedFrom, ...]:
        """The topologies ``epoch`` was resumed from, as far as this loader saw (the current epoch's, or a
        finished one's; none for epochs that ran at one topology or before a loaded state)."""
        return self.position.resumed_from if epoch == self.position.epoch else self._finished_resumed_from.get(epoch, ())

    @property
    def epoch(self) -> int:
        """The epoch being iterated, or the next iteration's."""
        return self.position.epoch

    @property
    def current_epoch(self) -> int:
        """What ``describe`` names by default: the epoch being iterated, or the one last iterated
        (its last batch handed out moves the position on, not this), else the next iteration's."""
        return self.iterated if self.iterated is not None else self.position.epoch

    def upcoming(self) -> Position:
        """Where the next iteration starts: an epoch under way or broken off starts over (a broken-off
        one also forgets the topologies it was resumed from, as a fresh epoch at the current one)."""
        if self.phase is Phase.RUNNING:
            return replace(self.position, consumed=0, resumed_from=self.position.resumed_from if self.streaming else ())
        if self.phase is Phase.BROKEN_OFF:
            return Position(self.position.epoch)
        return self.position

    def begin(self) -> Position:
        """An iteration starts: it runs from the upcoming position."""
        self.position, self.phase = self.upcoming(), Phase.RUNNING
        self.loaded, self.iterated = False, self.position.epoch
        return self.position

    def advance(self, position: Position) -> None:
        """The running iteration has handed out the batches up to ``position``."""
        self.position = position

    def finish(self) -> None:
        """The running epoch's batches are all handed out: the next iteration starts the next epoch."""
        if self.position.resumed_from:
            self._finished_resumed_from[self.position.epoch] = self.position.resumed_from
        self.position, self.phase = Position(self.position.epoch + 1), Phase.IDLE

    def break_off(self) -> None:
        """The running iteration stopped before its last batch (a break, an error, the iterator dropped)."""
        self.phase = Phase.BROKEN_OFF

    def set_epoch(self, epoch: int, samples_of: Callable[[int], int]) -> None:
        """The next iteration yields ``epoch`` from its start; the epoch it is already at keeps its
        position (a loaded state's), and the epoch a loaded state finished (saved after its last
        batch: at the next epoch's start) stays finished, its iteration yielding nothing more, as a
        loop that saved its own epoch number beside the state and set it again expects (not the
        epoch over). ``samples_of(epoch)``: the epoch's samples (rows), all consumed then."""
        finished_by_loaded = self.loaded and self.phase is Phase.IDLE and self.position.consumed == 0 and epoch == self.position.epoch - 1
        self.position, self.phase = self.upcoming(), Phase.IDLE
        self.loaded, self.iterated = False, None
        if finished_by_loaded:
            self.position = Position(epoch, samples_of(epoch))
        elif epoch != self.position.epoch:
            self.position = Position(epoch)

    def state_dict(self, seed: int, identity: str, topology: tuple[int, int], order: OrderSettings) -> dict[str, Any]:
        """The position as a checkpoint, with the order's settings and the topology (world size,
        batch size) it was reached at."""
        position = self.position
        state: dict[str, Any] = {"version": STATE_VERSION, "seed": seed, "epoch": position.epoch,
                                 "samples_consumed": position.consumed, "dataset": identity, **order.as_state()}
        state.update(world_size=topology[0], batch_size=topology[1], resumed_from=[list(g) for g in position.resumed_from])
        return state

    def restore(self, position: Position) -> None:
        """The next iteration starts at ``position`` (a loaded checkpoint's, see :func:`read_state_dict`)."""
        self.position, self.phase = position, Phase.IDLE
        self.loaded, self.iterated = True, None


def read_state_dict(state: dict[str, Any], seed: int, identity: str, topology: tuple[int, int], order: OrderSettings,
                    epoch_samples: Callable[[Position], int], unit: str = "samples", lengths: tuple[int, int] | None = None,
                    cursor: tuple[int, int] | None = None) -> Position:
    """The position of a checkpoint made for the same seed, dataset and order, every field checked
    (a ValueError naming it; ``epoch_samples(position)``: the samples, or ``unit``, the position's
    epoch holds); saved at another topology, the saved one is recorded in ``resumed_from`` (the streaming
    order then deals the unseen samples anew, from position 0; the global order continues at the same position).
    ``lengths``: the token loader's (saved, this loader's) seq_len, part of its topology and of each ``resumed_from`` entry;
    ``cursor``: best-fit's window holding row ``samples_consumed`` and its first row, which an entry for another seq_len ends with."""
    if state.get("version") in OLDER_ORDERS:
        raise ValueError(f"this loader state (version {state['version']}) was saved by an older fastload whose shuffled "
                         f"orders differ from this one's ({OLDER_ORDERS[state['version']]} since): resuming from it would "
                         "repeat some samples and skip others. Finish that epoch with the older fastload, or start the "
                         "epoch over (load nothing, set_epoch(epoch))")
    if state.get("version") != STATE_VERSION:
        raise ValueError(f"loader state version {state.get('version')} is not {STATE_VERSION}")
    missing = [name for name in STATE_REQUIRED if name not in state]
    if missing:
        raise ValueError(f"loader state lacks {', '.join(missing)}: not a whole loader.state_dict()")
    if state["seed"] != seed:
        raise ValueError(f"state was saved with seed={state['seed']}, this loader has seed={seed}")
    if state.get("dataset", identity) != identity:
        raise ValueError(f"state was saved for another dataset (identity {state['dataset']}, this loader reads {identity})")
    for name, value in order.as_state().items():
        if state.get(name) != value:
            raise ValueError(f"state was saved with {name}={state.get(name)!r}, this loader has {name}={value!r}: "
                             "the same position would name other samples")
    epoch, consumed = state_number(state["epoch"], "epoch", 0), state_number(state["samples_consumed"], "samples_consumed", 0)
    saved = (state_number(state.get("world_size", topology[0]), "world_size", 1),
             state_number(state.get("batch_size", topology[1]), "batch_size", 1))
    resumed_from = read_resumed_from(state.get("resumed_from", []), consumed, order.streaming, None if lengths is None else lengths[0])
    if consumed and (saved != topology or (lengths is not None and lengths[0] != lengths[1])):
        resumed_from.append((*saved, consumed) if lengths is None else
                            (*saved, consumed, lengths[0], *(cursor if cursor is not None and lengths[0] != lengths[1] else ())))
        if order.streaming:
            consumed = 0
    position = Position(epoch, consumed, tuple(resumed_from))
    if consumed > (samples := epoch_samples(position)):
        raise ValueError(f"loader state: samples_consumed={consumed} is past the end of epoch {epoch} ({samples} {unit})")
    return position


def state_number(value: Any, name: str, least: int) -> int:
    """``value`` of the state's field ``name`` as an int; a ValueError naming the field unless it is a whole number, at least ``least``."""
    try:
        number = operator.index(value)  # an int, a NumPy integer, an integer tensor of one value
    except TypeError:
        number = None
    if number is None or isinstance(value, bool):
        raise ValueError(f"loader state: {name}={value!r} is not a whole number")
    if number < least:
        raise ValueError(f"loader state: {name}={number} is less than {least}")
    return number


def read_resumed_from(entries: Any, consumed: int, streaming: bool, seq_len: int | None = None) -> list[ResumedFrom]:
    """A state's ``resumed_from``: (world size >= 1, batch size >= 1, samples consumed >= 0) triples; in the
    global order, whose positions run on across topologies, ascending and none past ``samples_consumed``.
    With ``seq_len`` (a token loader's, as saved) each entry goes on with its rows' seq_len >= 1 (a triple: ``seq_len``'s)
    and, best-fit's where the seq_len changed there, the window holding its row and that window's first row (>= 0)."""
    triples: list[ResumedFrom] = []
    names = ("world_size", "batch_size", "samples_consumed", "seq_len", "window", "window_first")
    for number, entry in enumerate(entries if isinstance(entries, (list, tuple)) else [entries]):
        if not isinstance(entry, (list, tuple)) or not (len(entry) == 3 or (seq_len is not None and len(entry) in (4, 6))):
            raise ValueError(f"loader state: resumed_from holds {entry!r}, not a (world_size, batch_size, samples_consumed) triple"
                             + ("" if seq_len is None else " (nor one with its rows' seq_len, and best-fit's window and its first row)"))
        triples.append(tuple(state_number(value, f"resumed_from[{number}].{name}", least)
                             for value, name, least in zip(entry, names, (1, 1, 0, 1, 0, 0))))
    if not streaming and any(b[2] < a[2] for a, b in itertools.pairwise([*triples, (1, 1, consumed)])):
        raise ValueError(f"loader state: resumed_from {[list(t) for t in triples]} does not ascend to samples_consumed={consumed}")
    return triples if seq_len is None else [t if len(t) > 3 else (*t, seq_len) for t in triples]


STATE_REQUIRED = ("seed", "epoch", "samples_consumed")  # what a state_dict() always holds
