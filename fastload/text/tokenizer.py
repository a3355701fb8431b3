"""A local tokenizer, its identity and encoding: a Hugging Face ``tokenizer.json`` (or a folder
holding one) through ``tokenizers``, or a ``transformers`` tokenizer folder without one. Nothing
is ever downloaded. The identity (sha256 of the file(s), vocabulary size, special ids, how and by
what documents were encoded) goes into a token dataset's index.json, so a loader or a resumed
conversion can tell it was made with this one.

A special token's text inside a document (``<|endoftext|>`` written in it) is encoded as ordinary
text by default, so no document can forge a boundary: its ids are those the same tokenizer gives
with its special added tokens unknown (tiktoken's ``encode_ordinary``); other added tokens still
match. ``allow_special_tokens`` gives such text the special token's id instead.

A ``tokenizer.json`` may be encoded by fastokens (``fast``: ``fastload.text.fast_encoder``) where
``with_fast_encoder`` finds it loads and gives ``tokenizers``' ids on a sample of the corpus."""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, replace
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
    token's text in a document is encoded as that token's id (else as ordinary text); ``fast``:
    encoded by fastokens (a tokenizer.json only; see ``with_fast_encoder``)."""

    path: str
    bos_token: str | None = None
    eos_token: str | None = None
    allow_special_tokens: bool = False
    fast: bool = False

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

    @cached_property
    def _fast(self) -> Any:
        """fastokens' tokenizer of the tokenizer.json (an ImportError or ValueError where it cannot be)."""
        from fastload.text import fast_encoder

        if self._file is None:
            raise ValueError(f"{self.path}: a transformers folder without tokenizer.json (fastokens reads tokenizer.json)")
        return fast_encoder.load_tokenizer_json(self._file)

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
                                 special_text="special" if self.allow_special_tokens else "ordinary", encoder=self._encoder_version(module))

    def _encoder_version(self, module: Any) -> str:
        """The library and version that make this tokenizer's ids."""
        if self.fast:
            from fastload.text import fast_encoder

            return fast_encoder.version()
        return str(module.version())

    def fast_twin(self) -> TextTokenizer:
        """This tokenizer encoding with fastokens, sharing the ``tokenizers`` object this one has
        loaded (read once a process, not once an encoder)."""
        twin = replace(self, fast=True)
        twin.__dict__["_loaded"] = self._loaded  # where cached_property keeps it (frozen: no setattr)
        return twin

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids, without special tokens added."""
        if self.fast:
            flat, lengths = self.encode_arrays(texts)
            return [ids.tolist() for ids in np.split(flat, np.cumsum(lengths)[:-1])] if texts else []
        module, tokenizer = self._loaded
        return module.encode(tokenizer, texts, self.allow_special_tokens)

    def encode_arrays(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The texts' ids back to back (uint32 from fastokens, else int64) and each text's count (int64)."""
        if self.fast:
            from fastload.text import fast_encoder

            return fast_encoder.encode_arrays(self._fast, texts, self.allow_special_tokens)
        encoded = self.encode(texts)
        lengths = np.fromiter((len(ids) for ids in encoded), dtype=np.int64, count=len(encoded))
        flat = np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int64, count=int(lengths.sum()))
        return flat, lengths

    def added_tokens(self) -> dict[str, int | None]:
        """Every added token's id by its text (special or not), as this tokenizer's encoder maps it."""
        module, tokenizer = self._loaded
        added = module.added_tokens(tokenizer)
        if not self.fast:
            return dict(added)
        from fastload.text import fast_encoder

        return {text: fast_encoder.token_id(self._fast, text) for text in added}

    def encode_each(self, texts: list[str]) -> list[list[int]]:
        """Each text's ids by ``tokenizers`` (or transformers), one text at a time (no thread pool:
        a process that forks workers afterwards keeps their tokenizers parallel)."""
        module, tokenizer = self._loaded
        return [module.encode_one(tokenizer, text, self.allow_special_tokens) for text in texts]

    def count_tokens(self, texts: list[str]) -> int:
        """How many ids the texts encode to (``encode_each``: no thread pool)."""
        return sum(map(len, self.encode_each(texts)))


def with_fast_encoder(tokenizer: TextTokenizer, sample: list[str], fast: TextTokenizer | None = None) -> tuple[TextTokenizer, str | None]:
    """``tokenizer`` encoding with fastokens (``fast``: that one, else made here) where it loads, gives
    every added token (special or not) the id ``tokenizers`` gives it, and the same ids on ``sample``
    and on the added tokens' text (alone, between words, all together); else ``tokenizer`` itself
    and, in one line, why not."""
    fast = fast if fast is not None else tokenizer.fast_twin()
    added = tokenizer.added_tokens()
    texts = [*sample, *added, *(f"a{text} b {text}." for text in added), "".join(added)]
    try:
        fast_added, fast_ids = fast.added_tokens(), fast.encode(texts)
    except (ImportError, ValueError) as exc:
        return tokenizer, str(exc)
    for text, want in sorted(added.items(), key=lambda pair: pair[1] or 0):
        if fast_added[text] != want:
            return tokenizer, f"{tokenizer.path}: fastokens gives added token {want} the id {fast_added[text]}"
    for number, (want_ids, ids) in enumerate(zip(tokenizer.encode_each(texts), fast_ids)):
        if want_ids != ids:
            what = f"sample text {number}" if number < len(sample) else "an added token's text"
            return tokenizer, f"{tokenizer.path}: fastokens' ids differ from tokenizers' on {what}"
    return fast, None


def _folder_sha256(folder: Path) -> str:
    """One digest of every file of a tokenizer folder (names and contents, in name order)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(folder).as_posix()}\0{file_sha256(path)}\n".encode())
    return digest.hexdigest()
