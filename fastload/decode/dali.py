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


def dali_available() -> bool:
    """Whether DALI can be imported (without raising)."""
    try:
        import_dali()
    except ImportError:
        return False
    return True


class DaliBatchDecoder:
    """A DALI pipeline that decodes each image's crop region (ROI decoding: nvJPEG and the
    hardware decoder with ``gpu``, libjpeg-turbo on the CPU otherwise), resizes it (antialiased
    linear) and mirrors it, giving uint8 NCHW batches as torch tensors on the pipeline's device.

    Inputs come from ``feed(batch_number)`` -> (encoded images, (x, y) anchors, (w, h) shapes,
    mirror flags), which raises StopIteration at the end of the epoch.
    """

    def __init__(
        self, batch_size: int, out_hw: tuple[int, int], num_threads: int, device_id: int | None, hw_decoder_load: float = 0.65
    ) -> None:
        self.batch_size, self.out_hw, self.num_threads, self.device_id = batch_size, out_hw, num_threads, device_id
        self.hw_decoder_load = hw_decoder_load  # share of images for the hardware JPEG decoder (A100/H100/H200)
        self.feed: Any = None
        self.base = 0
        self.pipe: Any = None

    def _source(self, info: Any) -> Any:
        return self.feed(self.base + info.iteration)

    def start(self, feed: Any, first_batch: int = 0) -> None:
        """(Re)build the pipeline to read ``feed`` from batch ``first_batch`` on."""
        dali = import_dali()
        fn, types = dali.fn, dali.types
        self.feed, self.base = feed, first_batch
        gpu = self.device_id is not None
        height, width = self.out_hw

        @dali.pipeline_def(batch_size=self.batch_size, num_threads=self.num_threads, device_id=self.device_id, prefetch_queue_depth=2)
        def pipeline():  # type: ignore[no-untyped-def]
            jpegs, anchors, shapes, mirror = fn.external_source(source=self._source, num_outputs=4, batch=True, batch_info=True)
            decode_args = {"hw_decoder_load": self.hw_decoder_load} if gpu else {}
            images = fn.decoders.image_slice(
                jpegs, anchors, shapes, device="mixed" if gpu else "cpu", output_type=types.RGB, axis_names="WH",
                normalized_anchor=False, normalized_shape=False, **decode_args,
            )
            images = fn.resize(images, resize_x=width, resize_y=height, antialias=True, interp_type=types.INTERP_LINEAR)
            return fn.crop_mirror_normalize(images, mirror=mirror, dtype=types.UINT8, output_layout="CHW")

        self.pipe = pipeline()
        self.pipe.build()

    def next_batch(self) -> Any:
        """The next decoded batch (raises StopIteration after the feed's last batch)."""
        import numpy as np
        import torch

        (images,) = self.pipe.run()
        dense = images.as_tensor()
        if self.device_id is None:
            return torch.from_numpy(np.array(dense))
        from nvidia.dali.plugin.pytorch import feed_ndarray

        out = torch.empty(dense.shape(), dtype=torch.uint8, device=f"cuda:{self.device_id}")
        feed_ndarray(dense, out, cuda_stream=torch.cuda.current_stream(out.device).cuda_stream)
        return out

    def close(self) -> None:
        """Release the pipeline (and its device memory)."""
        self.pipe = None
