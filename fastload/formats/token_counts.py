"""What a token shard's reader is told by the index (a leaf: the layout table and the token reader
both name it without naming each other)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ShardTokens:
    """What a token shard's reader checks its files against: the tokens the index counts in it, the
    dataset's token dtype and its tokenizer's vocabulary size."""

    tokens: int
    dtype: str
    vocab_size: int
