"""torch's sampling surface over the token loader, as fastload.loading.samplers gives the image
loader: ``loader.sampler`` (fastload.loading.samplers.LoaderSampler, a ``DistributedSampler`` of
this rank's rows, so Lightning leaves the loader as it is and its ``set_epoch`` reaches it) and
``loader.batch_sampler`` (LoaderBatchSampler), whose batches are :class:`TokenBatchIndices`: lists
of row numbers that a token dataset's ``__getitems__`` makes into the loader's very batch, so a
torch DataLoader built from the loader's parts (Accelerate's ``skip_first_batches``, which Hugging
Face's ``Trainer`` uses to resume) yields the same tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fastload.storage.dataset import ShardedDataset
from fastload.text.token_attention import batch_tensors, with_attention
from fastload.text.token_batch import Attention, BatchFiller, BatchFormat
from fastload.text.token_rows import Cursor, TokenOptions, TokenRows


@dataclass(frozen=True)
class TokenBatchRequest:
    """How the token loader makes one batch: enough for any process holding the dataset."""

    options: TokenOptions
    batch_format: BatchFormat
    attention: Attention | None
    seed: int
    shuffle: bool
    pad_id: int
    epoch: int
    first: int  # the batch's first row of the epoch
    cursor: Cursor | None  # best-fit: the window holding that row and the window's first row; concat: the rows' origin
    batch_size: int  # the batch's rows: its own, then padding


KEPT_ROWS = 4  # row makers a process keeps per dataset (the loaders it serves: one, or a few)


def rows_and_filler(dataset: ShardedDataset, request: TokenBatchRequest) -> tuple[TokenRows, BatchFiller]:
    """This process's rows and filler of ``dataset`` for ``request``'s loader (its options, seed, shuffle, format, pad id),
    made once and kept on the dataset while it lives (a worker of torch's DataLoader fills batch after batch: the corpus
    opened, an epoch's rows made and a text column's encoded documents kept once, not once a batch)."""
    key = (request.options, request.seed, request.shuffle, request.batch_format, request.pad_id)
    kept = dataset.made_here().setdefault(TokenRows, {})
    found = kept.get(key)
    if found is None:
        rows = TokenRows(dataset, request.options, request.seed, request.shuffle)
        options = request.options
        found = kept[key] = (rows, BatchFiller(rows.corpus, options.seq_len, request.pad_id, options.ignore_index, request.batch_format))
        while len(kept) > KEPT_ROWS:
            kept.pop(next(iter(kept)))
    return found


class TokenBatchIndices(list):
    """One batch's row numbers (a list, as torch's batch samplers yield; the rest of the batch is
    padding) that a token dataset's ``__getitems__`` makes into the loader's batch."""

    def __init__(self, rows: Sequence[int], request: TokenBatchRequest) -> None:
        super().__init__(rows)
        self.request = request

    def __reduce__(self) -> tuple:
        return (TokenBatchIndices, (list(self), self.request))

    def fill(self, dataset: ShardedDataset) -> dict[str, Any]:
        """The batch as the loader makes it, made here from ``dataset``."""
        request = self.request
        rows, filler = rows_and_filler(dataset, request)
        arrays, bounds = filler.batch(rows.segments(request.epoch, request.first, len(self), request.cursor), request.batch_size)
        return with_attention(batch_tensors(arrays, bounds, request.batch_format), bounds, request.attention)


def token_collate(batch: Any) -> Any:
    """``loader.collate_fn``: a batch :meth:`TokenBatchIndices.fill` made is already whole; anything else goes to torch's default_collate."""
    return batch if isinstance(batch, dict) else torch.utils.data.default_collate(batch)
