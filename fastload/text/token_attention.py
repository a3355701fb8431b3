"""A filled token batch as the tensors the loader yields, and what its ``attention=`` adds so that a
model's attention keeps the documents of a row apart (fastload.text.token_batch.Attention).

Made in the training process after the batch reaches its device: a block-causal mask is
B * L * L values, so it is made where it is used (on a GPU, from ``position_ids``, in a few
kernels) rather than in the workers and copied across.
"""

from __future__ import annotations

from typing import Any

import torch

from fastload.text.token_batch import Attention, BatchBounds, BatchFormat


def batch_tensors(arrays: dict[str, Any], bounds: BatchBounds, batch_format: BatchFormat) -> dict[str, torch.Tensor]:
    """The filled (B, L) arrays as tensors; the next-token format adds ``cu_seqlens`` and ``max_seqlen``."""
    batch = {name: value if isinstance(value, torch.Tensor) else torch.from_numpy(value) for name, value in arrays.items()}
    if batch_format is BatchFormat.NEXT_TOKEN:
        batch["cu_seqlens"] = torch.frombuffer(bounds.cu_seqlens, dtype=torch.int32)
        batch["max_seqlen"] = torch.tensor(bounds.max_seqlen)
    return batch


def block_causal_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """The (B, 1, L, L) float32 additive mask of rows whose segments start where ``position_ids`` is
    0: 0 where a token may attend (itself and its segment's earlier tokens), float32's lowest value elsewhere."""
    segment = torch.cumsum(position_ids == 0, dim=1)
    length = position_ids.shape[1]
    allowed = segment[:, :, None] == segment[:, None, :]
    allowed &= torch.ones(length, length, dtype=torch.bool, device=position_ids.device).tril()
    mask = torch.zeros(allowed.shape, dtype=torch.float32, device=position_ids.device)
    return mask.masked_fill_(~allowed, torch.finfo(torch.float32).min).unsqueeze(1)


def with_attention(batch: dict[str, torch.Tensor], bounds: BatchBounds, attention: Attention | None) -> dict[str, Any]:
    """``batch`` with what ``attention`` adds (on the batch's device); as it is for None."""
    if attention is Attention.BLOCK_CAUSAL:
        batch["attention_mask"] = block_causal_mask(batch["position_ids"])
    elif attention is Attention.VARLEN:
        batch.pop("attention_mask", None)
        device = batch["input_ids"].device
        cu_seqlens = batch.get("cu_seqlens")
        if cu_seqlens is None:
            cu_seqlens = torch.frombuffer(bounds.cu_seqlens, dtype=torch.int32).to(device)
        extra: dict[str, Any] = {"cu_seq_lens_q": cu_seqlens, "cu_seq_lens_k": cu_seqlens,
                                 "max_length_q": bounds.max_seqlen, "max_length_k": bounds.max_seqlen}
        return {**batch, **extra}
    return batch
