"""A local ``transformers`` tokenizer folder without a ``tokenizer.json`` (a slow tokenizer):
the only module importing transformers. Never downloads (``local_files_only``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_tokenizer_folder(path: Path) -> Any:
    """``AutoTokenizer`` of the folder ``path``, offline; a ValueError naming it where it cannot load."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ImportError(f"{path}: a tokenizer folder without tokenizer.json needs transformers: pip install 'fastload[text]'") from None
    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError, ... for a folder it cannot read
        raise ValueError(f"{path}: not a tokenizer folder transformers can read offline ({type(exc).__name__})") from None


def vocabulary(tokenizer: Any) -> dict[str, int]:
    """Every token's id, added tokens included."""
    return dict(tokenizer.get_vocab())


def special_tokens(tokenizer: Any) -> dict[str, int]:
    """The special tokens (bos, eos, pad, ... and additional ones) by text."""
    return {text: int(tokenizer.convert_tokens_to_ids(text)) for text in tokenizer.all_special_tokens}


def named_special(tokenizer: Any, name: str) -> str | None:
    """The text of the tokenizer's ``bos``, ``eos`` or ``pad`` token, if it has one."""
    value = getattr(tokenizer, f"{name}_token", None)
    return value if isinstance(value, str) else None


def added_tokens(tokenizer: Any) -> dict[str, int]:
    """Every added token's id (special or not), by text."""
    return {text: int(token_id) for text, token_id in tokenizer.added_tokens_encoder.items()}


def version() -> str:
    """The library and its version, as an index records what made the ids."""
    import transformers

    return f"transformers {transformers.__version__}"


def encode(tokenizer: Any, texts: list[str], allow_special: bool) -> list[list[int]]:
    """Each text's ids, no special tokens added; a special token's text in it encoded as ordinary
    text unless ``allow_special``."""
    return tokenizer(texts, add_special_tokens=False, split_special_tokens=not allow_special)["input_ids"]


def encode_one(tokenizer: Any, text: str, allow_special: bool) -> list[int]:
    """The ids of ``text`` as ``encode`` gives them."""
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=not allow_special)["input_ids"])
