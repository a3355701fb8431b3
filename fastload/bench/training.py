"""The data-stall analysis of ``fastload bench --model`` and ``benchmarks/bench_stall.py``: real
training steps fed by a loader against steps on one cached batch."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from fastload.loading.stats import stall_verdict

WARMUP_STEPS = 3


class StepTimer:
    """One model and optimizer (bf16 autocast on a GPU; optionally ``channels_last`` and
    ``torch.compile``, the configuration users train with), built once and timed against any loader."""

    def __init__(self, model_name: str, num_classes: int, channels_last: bool = False, compile: bool = False) -> None:
        import torch

        from fastload.bench.models import build_model

        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model_name, self.num_classes = model_name, num_classes
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        model = build_model(model_name, num_classes).to(self.device)
        if channels_last:
            model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # torch annotates no memory_format
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        self.model: Any = torch.compile(model) if compile else model

    def step(self, images: Any, labels: Any) -> None:
        """One training step on a uint8 NCHW batch."""
        import torch

        images = images.to(self.device, non_blocking=True).contiguous(memory_format=self.memory_format).float().div_(255)
        labels = labels.to(self.device, non_blocking=True).long().view(-1) % self.num_classes
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            loss = torch.nn.functional.cross_entropy(self.model(images), labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

    def sync(self) -> None:
        """Wait for the device's queued work."""
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def seconds_per_step(self, batches: Iterable, steps: int) -> float:
        """Mean wall time of ``steps`` steps on ``batches`` (after the device's queue is empty)."""
        batches = iter(batches)
        self.sync()
        start = time.perf_counter()
        for _ in range(steps):
            self.step(*next(batches))
        self.sync()
        return (time.perf_counter() - start) / steps

    def stall(self, loader: Iterable, steps: int) -> dict[str, Any]:
        """``steps`` steps fed by ``loader`` against as many on one cached batch: the share of step
        time spent waiting for data, the model's own images/s, and a verdict."""
        batches = iter(_forever(loader))
        cached = next(batches)
        for _ in range(WARMUP_STEPS):
            self.step(*next(batches))  # warms the model (compiles it), the allocator and the loader's pipeline
        fed_step = self.seconds_per_step(batches, steps)
        model_step = self.seconds_per_step(_repeat(cached), steps)
        stall = max(0.0, 1 - model_step / fed_step)
        batch = len(cached[0])
        return {"model": self.model_name, "device": str(self.device), "steps": steps, "stall_share": stall,
                "model_images_per_s": batch / model_step, "fed_images_per_s": batch / fed_step, "verdict": stall_verdict(stall)}


def data_stall(make: Callable[[], Iterable], model_name: str, steps: int, num_classes: int) -> dict[str, Any]:
    """Train ``steps`` steps fed by the loader ``make()`` makes and ``steps`` on one cached batch
    (:meth:`StepTimer.stall`), then close the loader."""
    loader = make()
    try:
        return StepTimer(model_name, num_classes).stall(loader, steps)
    finally:
        if hasattr(loader, "close"):
            loader.close()


def _forever(loader: Iterable) -> Iterable:
    while True:
        yield from loader


def _repeat(batch: Any) -> Iterable:
    while True:
        yield batch
