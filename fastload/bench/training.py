"""The data-stall analysis of ``fastload bench --model``: real training steps fed by a loader
against steps on one cached batch."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from fastload.stats import stall_verdict

WARMUP_STEPS = 3


def data_stall(make: Callable[[], Iterable], model_name: str, steps: int, num_classes: int) -> dict[str, Any]:
    """Train ``steps`` steps fed by the loader and ``steps`` on one cached batch: the share of step
    time spent waiting for data, the model's own images/s, and a verdict."""
    import torch

    from fastload.models import build_model

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(model_name, num_classes).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(images: Any, labels: Any) -> None:
        images = images.to(device, non_blocking=True).float().div_(255)
        labels = labels.to(device, non_blocking=True).long().view(-1) % num_classes
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    loader = make()
    batches = iter(_forever(loader))
    cached = next(batches)
    for _ in range(WARMUP_STEPS):
        step(*next(batches))  # warms the model, the allocator and the loader's pipeline
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step(*next(batches))
    sync()
    fed_step = (time.perf_counter() - start) / steps
    start = time.perf_counter()
    for _ in range(steps):
        step(*cached)
    sync()
    model_step = (time.perf_counter() - start) / steps
    if hasattr(loader, "close"):
        loader.close()
    stall = max(0.0, 1 - model_step / fed_step)
    batch = len(cached[0])
    return {"model": model_name, "device": str(device), "steps": steps, "stall_share": stall,
            "model_images_per_s": batch / model_step, "fed_images_per_s": batch / fed_step, "verdict": stall_verdict(stall)}


def _forever(loader: Iterable) -> Iterable:
    while True:
        yield from loader
