"""How the loader hands a batch out: ``(images, labels[, keys][, valid])`` for a labelled dataset,
else a dict with ``image`` (and ``key``, ``valid``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class BatchLayout:
    """The shape of a loader's batches; ``valid`` (evaluation mode only) marks padding entries."""

    has_labels: bool
    return_keys: bool
    evaluation: bool

    def shape(self, images: torch.Tensor, labels: torch.Tensor, keys: list[str], valid: np.ndarray) -> Any:
        """One batch in this layout."""
        if self.has_labels:
            batch: Any = (images, labels, keys) if self.return_keys else (images, labels)
            return (*batch, torch.from_numpy(valid)) if self.evaluation else batch
        batch = {"image": images}
        if self.return_keys:
            batch["key"] = keys
        if self.evaluation:
            batch["valid"] = torch.from_numpy(valid)
        return batch
