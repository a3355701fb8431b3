"""A local tokenizer, its identity and encoding: a Hugging Face ``tokenizer.json`` (or a folder
holding one) through ``tokenizers``, or a ``transformers`` tokenizer folder without one. Nothing
is ever downloaded. The identity (sha256 of the file(s), vocabulary size, special ids, how and by
what documents were encoded) goes into a token dataset's index.json, so a loader or a resumed
conversion can tell it was made with this one.

A special token's text inside a document (``<|endoftext|>`` written in it) is encoded as ordinary
text by default, so no document can forge a boundary: its ids are those the same tokenizer gives
with its special added tokens unknown (tiktoken's ``encode_ordinary``); other added tokens still
match. ``allow_special_tokens`` gives such text the special token's id instead."""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from fastload._util.files import file_sha256
from fastload.formats.index import TokenizerIdentity, token_dtype

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
# Special tokens taken as bos / eos / pad when the tokenizer's own config does not say (a bare tokenizer.json)
GUESSES = {
    "bos": ("<|begin_of_text|>", "<|startoftext|>", "<s>", "<bos>"),
    "eos": ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"),
    "pad": ("<|pad|>", "<pad>", "[PAD]"),
}


def _configured(folder: Path, name: str) -> str | None:
    """The ``{name}_token`` a folder's tokenizer_config.json names (a string, or {"content": ...});
    a config that is no JSON this reads is a ValueError naming it."""
    path = folder / CONFIG_FILE
    try:
        config = json.loads(path.read_bytes())
    except OSError:
        return None  # none (or none readable): the usual names are looked up instead
    except ValueError as exc:
        raise ValueError(f"{path}: not JSON ({type(exc).__name__})") from None
    except RecursionError:
        raise ValueError(f"{path}: JSON nested too deeply to read (deeper than Python's recursion limit)") from None
    value = config.get(f"{name}_token") if isinstance(config, dict) else None
    value = value.get("content") if isinstance(value, dict) else value
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class TextTokenizer:
    """The tokenizer at ``path`` (picklable: each process loads it on first use); ``bos_token`` /
    ``eos_token`` override the special tokens its config names; ``allow_special_tokens``: a special
    token's text in a document is encoded as that token's id (else as ordinary text)."""

    path: str
    bos_token: str | None = None
    eos_token: str | None = None
    allow_special_tokens: bool = False

    @property
    def _file(self) -> Path | None:
        """The tokenizer.json read with ``tokenizers`` (None: a transformers folder without one)."""
        path = Path(self.path)
        if path.is_file():
            return path
        return path / TOKENIZER_FILE if (path / TOKENIZER_FILE).is_file() else None

    @cached_property
    def _loaded(self) -> tuple[Any, Any]:
        """(the module that drives it, the library's tokenizer object)."""
        path = Path(self.path)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such tokenizer file or folder")
        if self._file is not None:
            from fastload.text import hf_tokenizers

            return hf_tokenizers, hf_tokenizers.load_tokenizer_json(self._file)
        from fastload.text import hf_transformers

        return hf_transformers, hf_transformers.load_tokenizer_folder(path)

    def _special_id(self, name: str, special: dict[str, int], vocab: dict[str, int]) -> int | None:
        """The id of the ``bos``/``eos``/``pad`` token: as overridden, else as configured, else a known name."""
        module, tokenizer = self._loaded
        asked = getattr(self, f"{name}_token", None)
        folder = Path(self.path) if Path(self.path).is_dir() else Path(self.path).parent
        text = asked or _configured(folder, name)
        if text is None and hasattr(module, "named_special"):
            text = module.named_special(tokenizer, name)
        if text is None:
            text = next((guess for guess in GUESSES[name] if guess in special), None)
        if text is None:
            return None
        if text not in vocab:
            raise ValueError(f"{self.path}: the {name} token {text!r} is not in the tokenizer's vocabulary")
        return vocab[text]

    @cached_property
    def identity(self) -> TokenizerIdentity:
        """What a token dataset records of this tokenizer."""
        module, tokenizer = self._loaded
        vocab = module.vocabulary(tokenizer)
        special = module.special_tokens(tokenizer)
        size = max(vocab.values(), default=-1) + 1
        if self._file is not None:
            digest, kind = file_sha256(self._file), "tokenizer.json"
        else:
            digest, kind = _folder_sha256(Path(self.path)), "transformers"
        return TokenizerIdentity(sha256=digest, vocab_size=size, dtype=token_dtype(size), kind=kind,
                                 bos_id=self._special_id("bos", special, vocab), eos_id=self._special_id("eos", special, vocab),
                                 pad_id=self._special_id("pad", special, vocab), special=dict(sorted(special.items())),
                                 special_text="special" if self.allow_special_tokens else "ordinary", encoder=module.version())

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids, without special tokens added."""
        module, tokenizer = self._loaded
        return module.encode(tokenizer, texts, self.allow_special_tokens)

    def encode_arrays(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The texts' ids back to back (int64) and each text's count."""
        encoded = self.encode(texts)
        lengths = np.fromiter((len(ids) for ids in encoded), dtype=np.int64, count=len(encoded))
        flat = np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int64, count=int(lengths.sum()))
        return flat, lengths

    def count_tokens(self, texts: list[str]) -> int:
        """How many ids the texts encode to, one text at a time (no thread pool: a process that
        forks workers afterwards keeps their tokenizers parallel)."""
        module, tokenizer = self._loaded
        return sum(module.count(tokenizer, text, self.allow_special_tokens) for text in texts)


def _folder_sha256(folder: Path) -> str:
    """One digest of every file of a tokenizer folder (names and contents, in name order)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(folder).as_posix()}\0{file_sha256(path)}\n".encode())
    return digest.hexdigest()
