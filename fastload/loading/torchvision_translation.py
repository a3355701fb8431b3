"""torchvision (v1 and v2) transform pipelines as fastload specs.

``translate(compose)`` turns the standard steps of a ``Compose`` into fastload's specs, so they run on
the fast path (planned from the header, decoded at the crop, one resample): RandomResizedCrop,
Resize, CenterCrop and RandomHorizontalFlip at the front, and ToTensor / ToImage / PILToTensor /
ToDtype / Normalize at the end (fused into fastload's batch-level ToDtype / Normalize). Any other
step — and every step after the first one that could not be translated — runs unchanged, by
torchvision itself, in the worker processes as a ``map`` step on the sample's tensors
(``TorchvisionSteps``); the log says which. torchvision is never imported here: steps are
recognised by their class and module, and only ``TorchvisionSteps`` (in the workers) imports it.
timm's ``create_transform`` pipelines are torchvision Composes: their RandomResizedCropAndInterpolation
(bilinear or bicubic) and MaybeToTensor translate like torchvision's RandomResizedCrop and ToTensor.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastload import transforms as T
from fastload.fields import SampleMap

log = logging.getLogger("fastload")

GEOMETRIC_NAMES = ("RandomResizedCrop", "Resize", "CenterCrop", "RandomHorizontalFlip")
TO_TENSOR_NAMES = ("ToTensor", "MaybeToTensor", "ToImage", "PILToTensor", "ToPureTensor")
IMAGE_NO_OPS = ("ToImage", "PILToTensor", "ToPureTensor")  # uint8 CHW in, uint8 CHW out
STEP_MODULES = ("torchvision.transforms", "timm.data")  # where the steps translate() knows come from
TIMM_NAMES = {"RandomResizedCropAndInterpolation": "RandomResizedCrop", "MaybeToTensor": "ToTensor"}  # timm's, as torchvision's
# torchvision's interpolation modes that fastload's antialiased bilinear resample stands in for.
RESAMPLED_MODES = ("bilinear", "bicubic")


@dataclass(frozen=True)
class Translation:
    """What a torchvision pipeline became: fastload specs, and the steps torchvision still runs."""

    specs: tuple[T.Transform, ...]
    rest: TorchvisionSteps | None


def is_torchvision_pipeline(transform: object) -> bool:
    """True for a torchvision transform (a Compose or a single step, v1 or v2), or a list of
    torchvision steps (as Compose takes them); a TypeError for a list mixing them with fastload specs."""
    if isinstance(transform, (list, tuple)):
        foreign = [type(step).__name__ for step in transform if type(step).__module__.startswith(STEP_MODULES)]
        if foreign and len(foreign) < len(transform):
            raise TypeError(f"transform= mixes torchvision steps ({', '.join(foreign)}) with fastload specs: give one "
                            "kind (a torchvision Compose or list of steps, or fastload.transforms specs)")
        return bool(foreign)
    return type(transform).__module__.startswith("torchvision.transforms")


def translate(transform: object) -> Translation:
    """Translate a torchvision ``Compose`` (or one step, or a list of steps) into specs plus the
    untranslated rest."""
    steps = list(transform) if isinstance(transform, (list, tuple)) else list(getattr(transform, "transforms", [transform]))
    if any(type(s).__name__ == "Compose" for s in steps):
        raise TypeError("nested torchvision Compose: flatten it into one Compose")
    v2 = ".v2" in type(transform).__module__ or any(".v2" in type(s).__module__ for s in steps)
    head: list[T.Transform] = []
    while steps:
        if _step_name(steps[0]) in IMAGE_NO_OPS:  # fastload's images already are uint8 tensors
            steps.pop(0)
        elif (spec := _geometric_spec(steps[0])) is not None:
            head.append(spec)
            steps.pop(0)
        else:
            break
    tail, middle = _value_specs(steps)
    specs = tuple(head) + tail
    T.validate(specs)
    rest = TorchvisionSteps(tuple(middle), v2) if middle else None
    if rest is not None:
        log.warning("fastload: %s run by torchvision in the workers (not on the fast path)",
                    ", ".join(type(s).__name__ for s in middle))
    return Translation(specs, rest)


def _step_name(step: object) -> str:
    """The torchvision name of a step translate() knows (timm's under torchvision's), else ''."""
    kind = type(step)
    if not kind.__module__.startswith(STEP_MODULES):
        return ""
    return TIMM_NAMES.get(kind.__name__, kind.__name__) if kind.__module__.startswith("timm.") else kind.__name__


def _geometric_spec(step: Any) -> T.Transform | None:  # Any: a torchvision/timm step, known by its class name
    name = _step_name(step)
    if name not in GEOMETRIC_NAMES:
        return None
    if name == "RandomHorizontalFlip":
        return T.RandomHorizontalFlip(float(step.p))
    if name == "CenterCrop":
        return T.CenterCrop(tuple(step.size))
    interpolation = getattr(step, "interpolation", "bilinear")
    mode = str(getattr(interpolation, "value", interpolation))  # an InterpolationMode, or its string
    if mode not in RESAMPLED_MODES or getattr(step, "antialias", True) is False:
        return None
    if name == "RandomResizedCrop":
        return T.RandomResizedCrop(tuple(step.size), tuple(step.scale), tuple(step.ratio))
    if getattr(step, "max_size", None) is not None:
        return None
    size = step.size
    if not isinstance(size, int):
        size = int(size[0]) if len(size) == 1 else (int(size[0]), int(size[1]))
    return T.Resize(size)


def _value_specs(steps: list[Any]) -> tuple[tuple[T.Transform, ...], list[Any]]:
    """Split off the trailing to-tensor / dtype / normalize steps as one batch-level spec."""
    cut = len(steps)
    while cut and _step_name(steps[cut - 1]) in (*TO_TENSOR_NAMES, "ToDtype", "ConvertImageDtype", "Normalize"):
        cut -= 1
    spec: T.ToDtype | T.Normalize | None = None
    for step in steps[cut:]:
        name = _step_name(step)
        if name == "ToTensor":
            spec = T.ToDtype("float32", True)
        elif name in ("ToDtype", "ConvertImageDtype"):
            dtype = _dtype_name(getattr(step, "dtype", None))
            if dtype is None:
                raise TypeError(f"{step!r}: fastload translates one torch dtype for the image (one of {T.DTYPES})")
            spec = T.ToDtype(dtype, name == "ConvertImageDtype" or bool(getattr(step, "scale", False)))
        elif name == "Normalize":
            if not isinstance(spec, T.ToDtype) or spec.dtype == "uint8":
                raise TypeError("Normalize needs float images: put ToTensor or ToDtype(torch.float32, scale=True) before it")
            per = 1.0 if spec.scale else 255.0  # unscaled floats are 0..255: the same as 0..1 with mean, std / 255
            spec = T.Normalize(tuple(float(m) / per for m in step.mean), tuple(float(s) / per for s in step.std), spec.dtype)
    return ((spec,) if spec else ()), steps[:cut]


def _dtype_name(dtype: object) -> str | None:
    name = str(dtype).removeprefix("torch.")
    return name if name in T.DTYPES else None


@dataclass(frozen=True)
class TorchvisionSteps:
    """torchvision steps run on one decoded sample in a worker, as a ``map`` (picklable).

    The sample is the loader's: the image a CHW uint8 array, masks HW uint8. The image goes in as a
    CHW uint8 tensor (a ``tv_tensors.Image`` for v2, with masks as 1xHxW ``tv_tensors.Mask`` so
    geometric v2 steps move them too) and comes back as CHW uint8 of the same size. torch's random
    generator is seeded from the sample's generator, so the steps replay exactly on resume.
    """

    steps: tuple[Any, ...]
    v2: bool
    made_in: int = field(default_factory=os.getpid, compare=False)  # the training process's pid

    def __call__(self, sample: dict[str, Any], rng: np.random.Generator, image: str, masks: Sequence[str] = ()) -> dict[str, Any]:
        import torch

        if os.getpid() != self.made_in and torch.get_num_threads() != 1:
            torch.set_num_threads(1)  # in a worker, as torch's own workers do: the workers already fill the cores
        tensors = {image: torch.from_numpy(sample[image])}
        tensors.update((name, torch.from_numpy(sample[name])[None]) for name in masks)
        with torch.random.fork_rng(devices=[]):  # inline (num_workers=0), the training process's generator is left alone
            torch.manual_seed(int(rng.integers(2**63)))
            if self.v2:
                from torchvision import tv_tensors

                wrapped = {name: (tv_tensors.Image(t) if name == image else tv_tensors.Mask(t)) for name, t in tensors.items()}
                for step in self.steps:
                    wrapped = step(wrapped)
                tensors = {name: t.as_subclass(torch.Tensor) for name, t in wrapped.items()}
            else:
                for step in self.steps:
                    tensors[image] = step(tensors[image])
        out = dict(sample)
        for name, t in tensors.items():
            if t.dtype != torch.uint8:
                raise TypeError(f"torchvision steps in map= must keep field {name!r} uint8 (got {t.dtype}); "
                                "put ToDtype/Normalize at the end of the Compose")
            out[name] = (t if name == image else t[0]).numpy()
        return out


def steps_as_map(rest: TorchvisionSteps, image: str, masks: Sequence[str] = (), then: SampleMap | None = None) -> SampleMap:
    """``rest`` bound to the sample's field names, in the ``map=(sample, rng) -> sample`` form;
    ``then`` (the user's own ``map=``) runs after it on its result, with the same generator."""
    return _BoundSteps(rest, image, tuple(masks), then)


@dataclass(frozen=True)
class _BoundSteps:
    rest: TorchvisionSteps
    image: str
    masks: tuple[str, ...]
    then: SampleMap | None = None

    def __call__(self, sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        out = self.rest(sample, rng, self.image, self.masks)
        return out if self.then is None else self.then(out, rng)
