"""NVIDIA DALI, imported lazily: the only module that imports ``nvidia.dali``."""

from __future__ import annotations

from typing import Any


def import_dali():  # type: ignore[no-untyped-def]
    """The ``nvidia.dali`` module, or an error naming the extra that installs it."""
    try:
        import nvidia.dali as dali
        import nvidia.dali.fn  # noqa: F401 - make dali.fn and dali.types available
        import nvidia.dali.types  # noqa: F401
    except ImportError:
        raise ImportError("NVIDIA DALI is not installed: pip install 'fastload[dali]'") from None
    return dali


def torch_iterator(pipeline: Any, names: list[str], reader_name: str) -> Any:
    """DALI's PyTorch iterator over a built pipeline: every sample once per epoch, auto-reset."""
    import_dali()
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    return DALIGenericIterator(pipeline, names, reader_name=reader_name, last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True)
