"""A batch of token rows as a language model's training loop takes it: ``input_ids``, ``labels``
(the next token; the ignore index across document boundaries and on padding), ``position_ids``
restarting at each document, ``attention_mask`` (0 on padding), and the boundaries for
variable-length attention as flash-attention takes them: ``cu_seqlens`` (int32, over the batch
flattened to ``B * L`` tokens; padding is a segment of its own) and ``max_seqlen``."""

from __future__ import annotations

import numpy as np

from fastload.loading.token_rows import Row, TokenCorpus

IGNORE_INDEX = -100  # what torch's cross_entropy and Hugging Face models ignore in labels


def assemble(rows: list[Row], seq_len: int, corpus: TokenCorpus, pad_id: int, ignore_index: int = IGNORE_INDEX) -> dict[str, np.ndarray]:
    """The batch of ``rows`` (each a list of segments; an empty row is padding), one ``pread`` a segment."""
    count = len(rows)
    input_ids = np.full((count, seq_len), pad_id, dtype=np.int64)
    labels = np.full((count, seq_len), ignore_index, dtype=np.int64)
    position_ids = np.zeros((count, seq_len), dtype=np.int64)
    attention_mask = np.zeros((count, seq_len), dtype=np.int64)
    positions = np.arange(seq_len, dtype=np.int64)
    bounds = [0]
    longest = 0
    for r, row in enumerate(rows):
        column = 0
        for segment in row:
            n = segment.length
            tokens = corpus.read(segment.start, n + segment.continues)
            end = column + n
            input_ids[r, column:end] = tokens[:n]
            labels[r, column : end - 1] = tokens[1:n]
            if segment.continues:
                labels[r, end - 1] = tokens[n]
            position_ids[r, column:end] = positions[:n]
            attention_mask[r, column:end] = 1
            bounds.append(r * seq_len + end)
            longest = max(longest, n)
            column = end
        if column < seq_len:
            bounds.append((r + 1) * seq_len)
            longest = max(longest, seq_len - column)
    return {"input_ids": input_ids, "labels": labels, "position_ids": position_ids, "attention_mask": attention_mask,
            "cu_seqlens": np.asarray(bounds, dtype=np.int32), "max_seqlen": np.asarray(longest, dtype=np.int64)}
