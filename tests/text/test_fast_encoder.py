"""``fastload convert --encoder fast|auto``: fastokens gives the ids ``tokenizers`` gives on every
document, for each family of tokenizer.json the tests can build offline, in both special-token
modes; where fastokens cannot load a tokenizer (an NFKC normalizer) auto falls back to tokenizers
saying so in one line and fast refuses it."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from fastload.cli.command import main
from fastload.converters import ConvertOptions, convert
from fastload.converters.convert_options import TokenizeOptions
from fastload.formats.index import read_index
from tests.text.conftest import VOCAB, forging_documents, real_paragraphs, write_jsonl
from tests.text.test_convert_tokens import documents

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                  r"|\s+(?!\S)|\s+")
UNICODE = ["Grüße aus Köln, naïve café", "日本語のテキストです。", "emoji 🙂🚀 and ☃ snow", "tabs\tand\r\nnewlines\n\n  ",
           "numbers 1234567 and 3.14159", "Ελληνικά κείμενα", "mixed: x²+y²=z² ∑∫ √2", "  leading and trailing spaces  "]


def corpus_texts(eos: str, other: str) -> list[str]:
    """The test corpus: the real paragraphs, the forging documents of this tokenizer's specials, unicode."""
    return real_paragraphs() + forging_documents(eos, other) + UNICODE


def train(tmp: Path, pre_tokenizer, specials: list[str], model=None, decoder=None, alphabet: tuple[str, ...] = ()) -> dict:
    """A BPE tokenizer of VOCAB ids trained on the real paragraphs, as tokenizer.json's data."""
    from tokenizers import Tokenizer, models, trainers

    tokenizer = Tokenizer(model or models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoder
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials, initial_alphabet=list(alphabet), show_progress=False)
    tokenizer.train_from_iterator(real_paragraphs(), trainer=trainer)
    tokenizer.save(str(tmp / "trained.json"))
    return json.loads((tmp / "trained.json").read_text())


def gpt2(tmp: Path, tokenizer_file: Path) -> dict:
    """GPT-2: byte-level BPE (the conftest fixture)."""
    return json.loads(tokenizer_file.read_text())


def llama3(tmp: Path, tokenizer_file: Path) -> dict:
    """Llama 3: its regex split, then byte-level without a regex; merges ignored for whole words."""
    from tokenizers import Regex, decoders, models, pre_tokenizers

    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return train(tmp, pre, ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>"],
                 model=models.BPE(ignore_merges=True), decoder=decoders.ByteLevel(), alphabet=tuple(pre_tokenizers.ByteLevel.alphabet()))


def byte_fallback(tmp: Path, tokenizer_file: Path) -> dict:
    """Llama 2 / Mistral's tokenizer.json: spaces normalized to ▁ (one prepended), no pre-tokenizer,
    and characters outside the vocabulary as <0xNN> byte tokens (trained split at ▁, for speed)."""
    from tokenizers import decoders, models, pre_tokenizers

    data = train(tmp, pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first"), ["<unk>", "<s>", "</s>"],
                 model=models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True),
                 decoder=decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]))
    vocab = data["model"]["vocab"]
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    data["pre_tokenizer"] = None
    data["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                                              {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
    return data


FAMILIES = {  # name -> (its tokenizer.json's data, two of its special tokens)
    "gpt2-byte-level": (gpt2, ("<|endoftext|>", "<|pad|>")),
    "llama3-regex": (llama3, ("<|end_of_text|>", "<|begin_of_text|>")),
    "byte-fallback": (byte_fallback, ("</s>", "<s>")),
}


def convert_with(texts_file: Path, tokenizer: Path, out: Path, encoder: str, allow: bool) -> list[list[int]]:
    """Every document's ids, converted with ``encoder`` (checked to be the one the index names)."""
    options = ConvertOptions(source="jsonl", layout="tokens",
                             tokens=TokenizeOptions(str(tokenizer), shard_tokens=200_000, encoder=encoder, allow_special_tokens=allow))
    index = convert(str(texts_file), str(out), options, quiet=True).index
    assert index.tokenizer.encoder.startswith("fastokens " if encoder == "fast" else "tokenizers ")
    assert index.tokenizer.special_text == ("special" if allow else "ordinary")
    return documents(out)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_fast_encoder_gives_tokenizers_ids_on_every_document(family: str, tokenizer_file: Path, tmp_path: Path) -> None:
    pytest.importorskip("fastokens")
    make, (eos, other) = FAMILIES[family]
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(make(tmp_path, tokenizer_file)))
    texts = corpus_texts(eos, other)
    write_jsonl(tmp_path / "docs.jsonl", texts)
    for allow in (False, True):
        slow = convert_with(tmp_path / "docs.jsonl", path, tmp_path / f"slow-{allow}", "tokenizers", allow)
        fast = convert_with(tmp_path / "docs.jsonl", path, tmp_path / f"fast-{allow}", "fast", allow)
        assert len(fast) == len(texts) and fast == slow
        special = set(read_index(tmp_path / f"fast-{allow}").tokenizer.special.values())
        forged = sum(bool(special & set(ids)) for ids in fast)
        assert forged == 0 if not allow else forged > 250  # no boundary forged unless allowed
    if family == "byte-fallback":
        first_byte = json.loads(path.read_text())["model"]["vocab"]["<0x00>"]
        assert any(i >= first_byte for ids in fast for i in ids)  # the unicode documents fell back to bytes


ADDED = {"single_word": False, "lstrip": False, "rstrip": False}


def nfkc(data: dict) -> dict:
    """An NFKC normalizer (fastokens refuses it)."""
    return {**data, "normalizer": {"type": "NFKC"}}


def added_with_gaps(data: dict) -> dict:
    """Added tokens whose ids leave a gap above the vocabulary, two special and one not: tokenizers
    numbers them on from the vocabulary (2000, 2001, 2002), fastokens keeps the file's ids."""
    added = [{"id": 2100, "content": "<|im_start|>", **ADDED, "normalized": False, "special": True},
             {"id": 2101, "content": "<|im_end|>", **ADDED, "normalized": False, "special": True},
             {"id": 2163, "content": "fastload", **ADDED, "normalized": True, "special": False}]
    return {**data, "added_tokens": data["added_tokens"] + added}


def vocabulary_with_gaps(data: dict) -> dict:
    """The same tokens in the model's vocabulary too, at those ids (which tokenizers keeps and
    fastokens cannot load)."""
    data = added_with_gaps(data)
    vocab = {**data["model"]["vocab"], **{token["content"]: token["id"] for token in data["added_tokens"][2:]}}
    return {**data, "model": {**data["model"], "vocab": vocab}}


FALLBACKS = {  # name -> (the tokenizer.json's change, the reason given)
    "nfkc": (nfkc, "fastokens cannot encode it (normalizer error: unsupported normalizer type: NFKC)"),
    "added-tokens-with-gaps": (added_with_gaps, "fastokens gives added token 2000 the id 2100"),
    "vocabulary-with-gaps": (vocabulary_with_gaps, "fastokens cannot encode it (model error: unsupported model type: Other)"),
}


@pytest.mark.parametrize("case", sorted(FALLBACKS))
def test_auto_falls_back_to_tokenizers_in_one_line_where_fastokens_cannot_or_differs_and_fast_refuses(
        case: str, tokenizer_file: Path, tmp_path: Path, caplog, capsys) -> None:
    pytest.importorskip("fastokens")
    change, reason = FALLBACKS[case]
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(change(json.loads(tokenizer_file.read_text()))))
    texts = ["ﬁne ligatures ① and ＡＢＣ full width", "fastload's <|im_start|>user\nhi<|im_end|>", *real_paragraphs()[:50]]
    write_jsonl(tmp_path / "docs.jsonl", texts)
    for allow in (False, True):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="fastload"):
            auto = convert_with(tmp_path / "docs.jsonl", path, tmp_path / f"auto-{allow}", "auto", allow)
        assert [r.getMessage() for r in caplog.records] == [f"fastload: encoding with tokenizers, not fastokens: {path}: {reason}"]
        assert auto == convert_with(tmp_path / "docs.jsonl", path, tmp_path / f"slow-{allow}", "tokenizers", allow)
    assert main(["convert", str(tmp_path / "docs.jsonl"), str(tmp_path / "fast"), "--from", "jsonl", "--tokenizer", str(path),
                 "--encoder", "fast", "--quiet"]) == 2
    assert capsys.readouterr().err == f"fastload convert: error: --encoder fast: {path}: {reason}\n"
    assert not (tmp_path / "fast" / "index.json").exists()


@pytest.mark.parametrize("added", [True, False])
def test_auto_without_fastokens_says_so_in_one_line(tokenizer_file: Path, tmp_path: Path, added: bool) -> None:
    path = tmp_path / "tokenizer.json"
    data = json.loads(tokenizer_file.read_text())
    path.write_text(json.dumps(data if added else {**data, "added_tokens": []}))  # without added tokens: nothing to look up
    write_jsonl(tmp_path / "docs.jsonl", real_paragraphs()[:20])
    blocked = ("import sys; sys.modules['fastokens'] = None; from fastload.cli.command import main; "  # as if not installed
               f"sys.exit(main(['convert', {str(tmp_path / 'docs.jsonl')!r}, {str(tmp_path / 'out')!r}, '--from', 'jsonl', "
               f"'--tokenizer', {str(path)!r}, '--quiet']))")
    run = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0 and run.stderr == ("fastload: encoding with tokenizers, not fastokens: fastokens is not installed: "
                                                  "pip install 'fastload[fast-tokenizer]'\n")
    assert read_index(tmp_path / "out").tokenizer.encoder.startswith("tokenizers ")


@pytest.mark.parametrize("preset", [None, "3"])
def test_forked_workers_share_the_cores_between_them(tokenizer_file: Path, tmp_path: Path, preset: str | None) -> None:
    """With 2 workers, fastokens is told to encode on each one's share of the cores (cores // 2
    threads, at least one) before the command encodes anything, unless the environment says;
    the shards are those one worker writes."""
    import os

    pytest.importorskip("fastokens")
    write_jsonl(tmp_path / "docs.jsonl", real_paragraphs()[:600])
    script = ("import json, os, sys; from fastload.cli.command import main; "
              f"code = main(['convert', {str(tmp_path / 'docs.jsonl')!r}, {str(tmp_path / 'two')!r}, '--from', 'jsonl', "
              f"'--tokenizer', {str(tokenizer_file)!r}, '--quiet', '--encoder', 'fast', '--workers', '2', '--shard-tokens', '20000']); "
              "print(json.dumps([code, os.environ.get('FASTOKENS_BPE_THREADS')]))")
    env = {k: v for k, v in os.environ.items() if k != "FASTOKENS_BPE_THREADS"} | ({"FASTOKENS_BPE_THREADS": preset} if preset else {})
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False, env=env)
    code, threads = json.loads(run.stdout.strip().splitlines()[-1])
    assert code == 0, run.stderr
    assert threads == (preset or str(max(1, len(os.sched_getaffinity(0)) // 2)))
    options = ConvertOptions(source="jsonl", layout="tokens", tokens=TokenizeOptions(str(tokenizer_file), shard_tokens=20_000, encoder="fast"))
    convert(str(tmp_path / "docs.jsonl"), str(tmp_path / "one"), options, quiet=True)
    assert len(read_index(tmp_path / "two").shards) > 2
    for name in sorted(p.name for p in (tmp_path / "one").glob("shard-*")):
        assert (tmp_path / "two" / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name


def test_a_resumed_conversion_never_mixes_encoders(tokenizer_file: Path, tmp_path: Path) -> None:
    from fastload.converters.partial import ConversionConflict

    pytest.importorskip("fastokens")
    src = tmp_path / "src"
    src.mkdir()
    write_jsonl(src / "a.jsonl", real_paragraphs()[:600])
    good_b = write_jsonl(src / "b.jsonl", real_paragraphs()[600:1200]).read_bytes()
    (src / "b.jsonl").write_bytes(good_b + b'{"text": 3}\n')  # a bad last document stops the first run

    def options(encoder: str) -> ConvertOptions:
        return ConvertOptions(source="jsonl", layout="tokens", tokens=TokenizeOptions(str(tokenizer_file), shard_tokens=10_000, encoder=encoder))

    with pytest.raises(Exception, match="field 'text' is a int"):
        convert(str(src), str(tmp_path / "out"), options("fast"), quiet=True)
    (src / "b.jsonl").write_bytes(good_b)
    with pytest.raises(ConversionConflict, match="holds an unfinished conversion made with other options or input"):
        convert(str(src), str(tmp_path / "out"), options("tokenizers"), quiet=True)
    report = convert(str(src), str(tmp_path / "out"), options("auto"), quiet=True)  # auto chooses fastokens again: resumed
    assert report.shards_reused >= 1 and report.index.tokenizer.encoder.startswith("fastokens ")


def test_shards_are_byte_identical_for_either_encoder_and_any_worker_count(tokenizer_file: Path, tmp_path: Path) -> None:
    """The same hostile corpus (real and forging documents between the bad-input tests' hostile
    lines) converted with --encoder fast and tokenizers, on 1 and 2 workers, with eos, a minimum
    length and skips: every shard file, and skipped.jsonl, the same bytes."""
    pytest.importorskip("fastokens")
    from fastload.converters.sources import SourceOptions
    from tests.text.test_token_bad_input import HOSTILE_LINES

    texts = [*real_paragraphs()[:1500], *forging_documents(), *UNICODE]
    good = [json.dumps({"text": text}).encode() + b"\n" for text in texts]
    step = len(good) // len(HOSTILE_LINES)
    lines = [line for n, hostile in enumerate(HOSTILE_LINES) for line in (*good[n * step:(n + 1) * step], hostile)]
    (tmp_path / "d.jsonl").write_bytes(b"".join(lines + good[len(HOSTILE_LINES) * step:]))
    outputs = {}
    for encoder in ("fast", "tokenizers"):
        for workers in (1, 2):
            out = tmp_path / f"{encoder}-{workers}"
            options = ConvertOptions(source="jsonl", layout="tokens", workers=workers, on_error="skip", source_options=SourceOptions(),
                                     tokens=TokenizeOptions(str(tokenizer_file), shard_tokens=30_000, encoder=encoder, append_eos=True,
                                                            min_tokens=4))
            index = convert(str(tmp_path / "d.jsonl"), str(out), options, quiet=True).index
            assert index.tokenizer.encoder.startswith("fastokens " if encoder == "fast" else "tokenizers ")
            outputs[encoder, workers] = {path.name: path.read_bytes() for path in sorted(out.iterdir()) if path.name != "index.json"}
    first = outputs["fast", 1]
    assert len([name for name in first if name.endswith(".bin")]) >= 3 and "skipped.jsonl" in first
    assert all(files == first for files in outputs.values())
