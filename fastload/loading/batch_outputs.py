"""How the loader hands a batch out: ``(images, labels[, keys][, valid])`` for a labelled dataset,
else a dict with ``image`` (and ``key``, ``valid``); and the samples a batch is made of, as a
``collate_fn=`` receives them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class BatchOutputs:
    """The shape of a loader's batches; ``valid`` (evaluation mode only) marks padding entries."""

    has_labels: bool
    return_keys: bool
    evaluation: bool

    def shape(self, images: torch.Tensor, labels: torch.Tensor, keys: list[str], valid: np.ndarray, name: str = "image") -> Any:
        """One batch with these outputs; ``name``: what an unlabelled batch calls the pixels (``image``, ``video``)."""
        if self.has_labels:
            batch: Any = (images, labels, keys) if self.return_keys else (images, labels)
            return (*batch, torch.from_numpy(valid)) if self.evaluation else batch
        batch = {name: images}
        if self.return_keys:
            batch["key"] = keys
        if self.evaluation:
            batch["valid"] = torch.from_numpy(valid)
        return batch

    def shape_fields(self, parts: tuple, keys: list[str], valid: np.ndarray) -> tuple:
        """One ``fields=`` batch: its parts in the fields' order, then keys and valid when asked for."""
        return parts + ((keys,) if self.return_keys else ()) + ((torch.from_numpy(valid),) if self.evaluation else ())


def samples_of(batch: tuple | dict) -> list[tuple | dict]:
    """The samples of a batch as the loader hands it out, each of the batch's structure (a tuple, or a
    dict for an unlabelled dataset) holding its row of every part: a tensor row (a view), a list
    entry; 0-d rows (labels, ``valid``) as Python scalars, as a torch Dataset usually returns them.
    ``torch.utils.data.default_collate(samples_of(batch))`` gives back the stacked parts."""
    names, parts = (list(batch), list(batch.values())) if isinstance(batch, dict) else (None, list(batch))
    rows = list(zip(*(_rows(part) for part in parts), strict=True))
    if names is None:
        return list(rows)
    return [dict(zip(names, row, strict=True)) for row in rows]


def _rows(part: Any) -> list:
    if isinstance(part, torch.Tensor) and part.ndim == 1:
        return part.tolist()
    return list(part.unbind(0)) if isinstance(part, torch.Tensor) else list(part)
