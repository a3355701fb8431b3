"""NVIDIA DALI, imported lazily: the only module that imports ``nvidia.dali``."""

from __future__ import annotations

from typing import Any


def import_dali():
    """The ``nvidia.dali`` module, or an error naming the extra that installs it."""
    try:
        import nvidia.dali as dali
        import nvidia.dali.fn
        import nvidia.dali.types  # noqa: F401
    except ImportError:
        raise ImportError("NVIDIA DALI is not installed: pip install 'fastload[dali]'") from None
    return dali


def dali_available() -> bool:
    """Whether DALI can be imported (without raising)."""
    try:
        import_dali()
    except ImportError:
        return False
    return True


def cuda_initialized() -> bool:
    """Whether this process has initialized the CUDA driver (DALI will not fork workers then)."""
    return bool(import_dali().backend.IsDriverInitialized())


def torch_iterator(pipeline: Any, names: list[str], reader_name: str) -> Any:
    """DALI's PyTorch iterator over a built pipeline: every sample once per epoch, auto-reset."""
    import_dali()
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    return DALIGenericIterator(pipeline, names, reader_name=reader_name, last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True)


def images_as_torch(dense: Any, device_id: int | None) -> Any:
    """A dense uint8 DALI batch (``TensorList.as_tensor()``) as a torch tensor: copied out of
    DALI's CPU memory, or into a fresh tensor on ``cuda:device_id`` on the current stream."""
    import numpy as np
    import torch

    if device_id is None:
        return torch.from_numpy(np.array(dense))
    import_dali()
    from nvidia.dali.plugin.pytorch import feed_ndarray

    out = torch.empty(dense.shape(), dtype=torch.uint8, device=f"cuda:{device_id}")
    feed_ndarray(dense, out, cuda_stream=torch.cuda.current_stream(out.device).cuda_stream)
    return out
