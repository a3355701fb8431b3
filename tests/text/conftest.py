"""Real text and a BPE tokenizer trained on it in a fixture (no network): paragraphs of Debian's
license texts and of the Python standard library's own sources, prose and code."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest

LICENSES = Path("/usr/share/common-licenses")
VOCAB = 2000


def real_paragraphs(limit: int = 3000) -> list[str]:
    """Paragraphs (blank-line separated) of real English prose and Python code, in a fixed order."""
    files = sorted(p for p in LICENSES.glob("*") if p.is_file()) if LICENSES.is_dir() else []
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files += [stdlib / name for name in ("textwrap.py", "argparse.py", "json/decoder.py", "csv.py", "difflib.py", "shutil.py")]
    paragraphs: list[str] = []
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        paragraphs += [p.strip() for p in text.split("\n\n") if len(p.strip()) > 40]
    return list(dict.fromkeys(paragraphs))[:limit]  # each once: licenses repeat paragraphs


def forging_documents(eos: str = "<|endoftext|>", other: str = "<|pad|>") -> list[str]:
    """Real paragraphs with two special tokens' text written into them: inside words, at the ends,
    next to punctuation and spaces, alone, twice in a row, cut short."""
    texts = [eos, f"a turn{eos}another turn", f"ends with {eos}.", f"{other}{eos}x", f" {eos} ", eos + eos, eos[:-1], eos[1:]]
    for n, paragraph in enumerate(real_paragraphs()[:400]):
        cut = len(paragraph) * (n % 7) // 6
        texts.append(paragraph[:cut] + (eos if n % 3 else f" {other}") + paragraph[cut:])
    return texts


@pytest.fixture(scope="session")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer.json (vocabulary 2,000, <|endoftext|> and <|pad|> special) trained on the real text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>", "<|pad|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(real_paragraphs(), trainer=trainer)
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def write_jsonl(path: Path, texts: list[str], field: str = "text") -> Path:
    """A JSON Lines file of one object per text."""
    path.write_text("".join(json.dumps({field: text, "id": n}) + "\n" for n, text in enumerate(texts)))
    return path


def paragraph_shards(root: Path, tokenizer_file: Path, paragraphs: int, shard_tokens: int) -> Path:
    """The first ``paragraphs`` real paragraphs, each ending in eos, converted to token shards of
    about ``shard_tokens`` tokens in ``root/ds``."""
    from fastload.converters import ConvertOptions, convert
    from fastload.converters.convert_options import TokenizeOptions

    write_jsonl(root / "docs.jsonl", real_paragraphs()[:paragraphs])
    convert(str(root / "docs.jsonl"), str(root / "ds"), ConvertOptions(
        source="jsonl", layout="tokens", tokens=TokenizeOptions(str(tokenizer_file), append_eos=True, shard_tokens=shard_tokens)), quiet=True)
    return root / "ds"


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of two JSONL files of the real paragraphs (the second also gzipped beside)."""
    root = tmp_path_factory.mktemp("corpus")
    paragraphs = real_paragraphs()
    write_jsonl(root / "a.jsonl", paragraphs[: len(paragraphs) // 2])
    write_jsonl(root / "b.jsonl", paragraphs[len(paragraphs) // 2 :])
    return root
