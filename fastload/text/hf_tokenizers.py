"""Hugging Face ``tokenizers`` (a ``tokenizer.json``): the only module importing it."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def import_tokenizers() -> Any:
    """The tokenizers module, or an error naming the extra that installs it."""
    try:
        import tokenizers
    except ImportError:
        raise ImportError("tokenizing text needs the tokenizers library: pip install 'fastload[text]'") from None
    return tokenizers


def load_tokenizer_json(path: Path) -> Any:
    """The ``tokenizers.Tokenizer`` of the file ``path``; a ValueError naming it where it does not parse."""
    tokenizers = import_tokenizers()
    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception as exc:  # the library raises a bare Exception for a file it cannot parse
        raise ValueError(f"{path}: not a tokenizer.json the tokenizers library can read ({type(exc).__name__})") from None


def vocabulary(tokenizer: Any) -> dict[str, int]:
    """Every token's id, added tokens included."""
    return tokenizer.get_vocab(with_added_tokens=True)


def special_tokens(tokenizer: Any) -> dict[str, int]:
    """The added tokens marked special, by text."""
    return {token.content: int(token_id) for token_id, token in tokenizer.get_added_tokens_decoder().items() if token.special}


def added_tokens(tokenizer: Any) -> dict[str, int]:
    """Every added token's id (special or not), by text."""
    return {token.content: int(token_id) for token_id, token in tokenizer.get_added_tokens_decoder().items()}


def version() -> str:
    """The library and its version, as an index records what made the ids."""
    return f"tokenizers {import_tokenizers().__version__}"


def encode(tokenizer: Any, texts: list[str], allow_special: bool) -> list[list[int]]:
    """Each text's ids, no special tokens added, on all cores (``encode_batch_fast``: no offsets);
    a special token's text in it encoded as ordinary text unless ``allow_special``."""
    tokenizer.encode_special_tokens = not allow_special  # True: special added tokens are not matched in the text
    return [encoding.ids for encoding in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]


def encode_one(tokenizer: Any, text: str, allow_special: bool) -> list[int]:
    """The ids of ``text`` as ``encode`` gives them (``Tokenizer.encode``: no thread pool)."""
    tokenizer.encode_special_tokens = not allow_special
    return list(tokenizer.encode(text, add_special_tokens=False).ids)
