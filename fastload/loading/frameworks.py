"""What training frameworks read from a DataLoader beyond torch's attributes, in one place.

Accelerate (checked against accelerate 1.15): ``prepare()`` wraps a DataLoader in its own torch
DataLoader (losing the fast path) unless the loader reports ``_is_accelerate_prepared``; it then
keeps it as it is and lists it for ``save_state``/``load_state``, which call ``state_dict()`` /
``load_state_dict()`` when ``use_stateful_dataloader`` is set. Gradient accumulation and
``gather_for_metrics`` read the iterating loader's ``end_of_dataloader`` and ``remainder`` from
accelerate's ``GradientState``, where the loader registers itself for the epoch. Accelerate is
never imported here: only used when the script already imported it.
"""

from __future__ import annotations

import sys
from typing import Any


def accelerate_device() -> Any:
    """The device of the script's Accelerator (the batches' device when the loader has none)."""
    state = sys.modules.get("accelerate.state")
    return None if state is None else state.PartialState().device


class KeptByAccelerate:
    """A loader that accelerate's ``prepare()`` keeps as it is (it shards by rank itself): the
    ``_is_accelerate_prepared`` it reads and sets, for a loader with ``_accelerate`` and ``device``."""

    _accelerate: bool
    device: Any

    @property
    def _is_accelerate_prepared(self) -> bool:
        """Read by accelerate's ``prepare()``: True keeps this loader, fast path and all, instead of a
        torch DataLoader around its dataset. Batches then go to the Accelerator's device unless
        ``device=`` was given, and epochs report to its GradientState."""
        if not self._accelerate:
            self._accelerate = True
            if self.device is None:
                self.device = accelerate_device()
        return True

    @_is_accelerate_prepared.setter
    def _is_accelerate_prepared(self, value: bool) -> None:  # accelerate's prepare() also sets it
        if value:
            _ = self._is_accelerate_prepared


class AccelerateEpoch:
    """Registers an epoch iterator with accelerate's GradientState while it runs: ``end_of_dataloader``
    turns True as the last batch is handed out; ``remainder`` is the real samples in the last
    global batch (``gather_for_metrics`` drops the padding after them), -1 when unknown."""

    def __init__(self, iterator: Any, remainder: int) -> None:
        state = sys.modules.get("accelerate.state")
        self._gradient_state = None if state is None else state.GradientState()
        self.iterator = iterator
        iterator.end_of_dataloader, iterator.remainder = False, remainder
        if self._gradient_state is not None:
            self._gradient_state._add_dataloader(iterator)

    def last_batch(self, remainder: int) -> None:
        """Called just before the epoch's last batch is handed out, with the real samples in the last global batch."""
        self.iterator.end_of_dataloader, self.iterator.remainder = True, remainder

    def end(self) -> None:
        """The epoch is over (finished or abandoned)."""
        if self._gradient_state is not None:
            self._gradient_state._remove_dataloader(self.iterator)
            self._gradient_state = None
