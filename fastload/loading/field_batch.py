"""A ``fields=`` batch assembled in the training process: the stacked fields' slot columns as
tensors (moved to the device; Normalize/ToDtype on images only, never on masks), the others as
lists, in the order the fields were asked for."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fastload.fields import SampleSpec
from fastload.loading.batch_outputs import BatchOutputs
from fastload.media import MEDIA_ROLES


def as_tensor(array: np.ndarray) -> torch.Tensor | np.ndarray:
    """``array`` as a tensor sharing its memory; a dtype torch lacks (strings, ...) stays numpy."""
    try:
        return torch.from_numpy(array)
    except TypeError:
        return array


def copied(array: np.ndarray, pin_memory: bool) -> torch.Tensor | np.ndarray:
    """A copy of a slot column's rows (into pinned memory when asked), so the slot can be refilled."""
    try:
        out = torch.empty(array.shape, dtype=torch.from_numpy(array[:0]).dtype, pin_memory=pin_memory)
    except TypeError:
        return array.copy()
    np.copyto(out.numpy(), array)
    return out


def field_batch(
    spec: SampleSpec,
    columns: dict[str, torch.Tensor | np.ndarray],
    values: dict[str, list],
    device: torch.device | None,
    image_fn: Callable[[torch.Tensor], torch.Tensor] | None,
) -> tuple:
    """The batch as a tuple in ``spec``'s field order: stacked columns on ``device`` (images and
    video frames through ``image_fn``; a media field followed by the columns its row of
    fastload.media puts beside it: audio's lengths), boxes and ragged arrays as lists of tensors,
    other values as lists."""
    out: list[Any] = []
    for field in spec.fields:
        if field.key in columns:
            value = columns[field.key]
            if device is not None and isinstance(value, torch.Tensor):
                value = value.to(device, non_blocking=True)
            media = MEDIA_ROLES.get(field.role)
            if (field.role == "image" or (media is not None and media.images)) and image_fn is not None and isinstance(value, torch.Tensor):
                value = image_fn(value)
            out.append(value)
            for column in media.beside(field.key) if media is not None else ():  # then audio's lengths: each crop's valid samples
                beside = columns[column]
                out.append(beside.to(device, non_blocking=True) if device is not None and isinstance(beside, torch.Tensor) else beside)
        elif field.role in ("boxes", "array"):
            arrays = (np.asarray(v) for v in values[field.key])
            out.append([as_tensor(a if a.flags.writeable else a.copy()) for a in arrays])
        else:
            out.append(values[field.key])
    return tuple(out)


def shaped_batch(
    spec: SampleSpec,
    outputs: BatchOutputs,
    columns: dict[str, torch.Tensor | np.ndarray],
    values: dict[str, list],
    keys: list[str],
    valid: np.ndarray,
    device: torch.device | None,
    image_fn: Callable[[torch.Tensor], torch.Tensor] | None,
) -> Any:
    """The batch as the loader hands it out: :func:`field_batch`'s parts as ``outputs`` shapes them —
    ``(images, labels, ...)`` for a classification spec, else the fields in their order."""
    parts = field_batch(spec, columns, values, device, image_fn)
    if spec.classic:
        images, labels = parts
        return outputs.shape(images, labels, keys, valid, spec.fields[0].key)
    return outputs.shape_fields(parts, keys, valid)
