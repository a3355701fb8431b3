"""The shortest path from an image folder to training batches.

    python examples/quickstart.py data/demo/raw /tmp/quickstart-wds
"""

from __future__ import annotations

import sys
import time

import fastload
from fastload import transforms as T
from fastload.converters import ConvertOptions, convert


def main(image_folder: str, out: str) -> None:
    # once: raw images -> shuffled WebDataset shards with an index (resumable, reproducible)
    convert(image_folder, out, ConvertOptions(source="imagefolder", shuffle=True, shard_bytes=64 * 10**6, workers=2))

    # every epoch: decode only what each crop needs, in worker processes, batches in shared memory
    loader = fastload.DataLoader(out, batch_size=64, shuffle=True, num_workers=2, transform=T.train(224, normalize=True))
    start, images = time.perf_counter(), 0
    for batch, labels in loader:  # noqa: B007 - the last batch's labels are printed below
        images += len(batch)  # a training step goes here
    print(f"{images} images of {loader.dataset.classes} in {time.perf_counter() - start:.1f}s: "
          f"batches of {tuple(batch.shape)} {batch.dtype}, labels {labels[:8].tolist()}...")
    loader.close()


if __name__ == "__main__":
    main(*sys.argv[1:3])
