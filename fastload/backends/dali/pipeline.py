"""The DALI pipeline that decodes the feed's batches: crop regions decoded (nvJPEG and the
hardware decoder on a GPU, libjpeg-turbo on the CPU), resized and mirrored into uint8 CHW batches."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastload.backends.dali.library import cuda_initialized, images_as_torch, import_dali
from fastload.backends.dali.protocol import DecodedColumns, FeedColumns, carried_fields, read_notes

if TYPE_CHECKING:
    from fastload.backends.dali.feed import DaliFeed


class DaliBatchDecoder:
    """A DALI pipeline that decodes each image's crop region (ROI decoding: nvJPEG and the
    hardware decoder with ``gpu``, libjpeg-turbo on the CPU otherwise), resamples the exact
    fractional crop box out of it (antialiased linear, as Pillow's and the CPU path's) and mirrors
    it, giving uint8 NCHW batches as torch tensors on the pipeline's device.

    Its input is a :class:`fastload.backends.dali.feed.DaliFeed`, run by DALI's parallel external source
    in ``workers`` processes, or in this process with ``workers=0``. The processes are forked
    while CUDA is not initialized in this process and spawned once it is (DALI refuses to fork
    then, as in a training process that has moved its model to the GPU).
    """

    def __init__(
        self, batch_size: int, out_hw: tuple[int, int], num_threads: int, device_id: int | None,
        hw_decoder_load: float = 0.65, workers: int = 0,
    ) -> None:
        self.batch_size, self.out_hw, self.num_threads, self.device_id = batch_size, out_hw, num_threads, device_id
        self.hw_decoder_load = hw_decoder_load  # share of images for the hardware JPEG decoder (A100/H100/H200)
        self.workers = workers
        self.feed: DaliFeed | None = None  # the feed the pipeline was built with
        self.pipe: Any = None
        self.epochs = 0  # DALI epochs begun since the build
        self.expected = self.taken = 0  # batches of the current DALI epoch: to deliver, delivered

    def carries_on(self, feed: DaliFeed) -> bool:
        """Whether :meth:`start` with ``feed`` carries the pipeline on into its next epoch: ``feed``
        is that epoch and the last one was taken to its end."""
        clean_end = self.pipe is not None and self.taken == self.expected
        return clean_end and self.feed is not None and feed == self.feed.next_epoch(self.epochs)

    def start(self, feed: DaliFeed, batches: int) -> None:
        """Deliver ``feed``'s next ``batches`` batches. The pipeline (and its worker processes)
        carries on into its next epoch when it can (:meth:`carries_on`); otherwise it is rebuilt
        (a GPU pipeline takes seconds to build)."""
        if self.carries_on(feed):
            self.pipe.reset()
            self.epochs += 1
        else:
            self.close()
            self._build(feed)
        self.expected, self.taken = batches, 0

    def _build(self, feed: DaliFeed) -> None:
        dali = import_dali()
        fn, types = dali.fn, dali.types
        gpu = self.device_id is not None
        height, width = self.out_hw
        parallel = self.workers > 0
        start_method = "spawn" if cuda_initialized() else "fork"
        pool = {"py_num_workers": self.workers, "py_start_method": start_method} if parallel else {}
        carried = carried_fields(feed.sample_spec)  # passed through untouched, after the decoded columns

        @dali.pipeline_def(
            batch_size=self.batch_size, num_threads=self.num_threads, device_id=self.device_id, prefetch_queue_depth=2, **pool
        )
        def pipeline():
            source = {"parallel": True, "prefetch_queue_depth": max(2, self.workers)} if parallel else {}
            outputs = fn.external_source(
                source=feed, num_outputs=len(FeedColumns._fields) + len(carried), batch=True, batch_info=True, **source
            )
            fed = FeedColumns(*outputs[: len(FeedColumns._fields)])
            decode_args = {"hw_decoder_load": self.hw_decoder_load} if gpu else {}
            images = fn.decoders.image_slice(
                fed.jpegs, fed.anchors, fed.shapes, device="mixed" if gpu else "cpu", output_type=types.RGB, axis_names="WH",
                normalized_anchor=False, normalized_shape=False, **decode_args,
            )
            images = fn.resize(images, resize_x=width, resize_y=height, roi_start=fed.roi_starts, roi_end=fed.roi_ends,
                               roi_relative=False, antialias=True, interp_type=types.INTERP_LINEAR)
            images = fn.crop_mirror_normalize(images, mirror=fed.mirror, dtype=types.UINT8, output_layout="CHW")
            return (*DecodedColumns(images=images, keys=fed.keys, notes=fed.notes), *outputs[len(FeedColumns._fields) :])

        self.pipe = pipeline()
        try:
            self.pipe.build()
        except RuntimeError as exc:
            if parallel and start_method == "spawn" and "initialization failed" in str(exc):
                raise RuntimeError(
                    "DALI's worker processes could not start. They are spawned because CUDA is initialized "
                    "in this process, and a spawned process re-imports the main script: guard its entry point "
                    "with `if __name__ == '__main__':`, or pass num_workers=0 to read batches in this process"
                ) from exc
            raise
        self.feed, self.epochs = feed, 1

    def next_batch(self) -> tuple[Any, list[str], list[tuple[str, str]], Any, tuple[Any, ...]]:
        """The next decoded batch: (images, keys, skip records, the SampleError of a sample that
        could not be read or None, the carried fields' tensor lists in the fields' order)."""
        outputs = self.pipe.run()
        out = DecodedColumns(*outputs[: len(DecodedColumns._fields)])
        self.taken += 1
        keys = [out.keys.at(i).tobytes().decode() for i in range(len(out.keys))]
        skipped, error = read_notes([out.notes.at(i).tobytes() for i in range(len(out.notes))])
        images = images_as_torch(out.images.as_tensor(), self.device_id)
        return images, keys, skipped, error, tuple(outputs[len(DecodedColumns._fields) :])

    def close(self) -> None:
        """Release the pipeline (its device memory and worker processes)."""
        self.pipe = None
