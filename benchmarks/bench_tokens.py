"""Token data side by side, on real text (Debian's documentation packages: the Python manual's
reStructuredText sources and the Debian Reference, prose and code):

    python benchmarks/bench_tokens.py WORK --rounds 3

1. WORK/corpus.jsonl: documents (paragraphs gathered to at most 4,000 characters) of the packages'
   text, and a byte-level BPE tokenizer (32,000 ids) trained on it (WORK/tokenizer.json);
2. conversion: the tokenizer's own ``encode_batch`` (and ``encode_batch_fast``) on all cores over
   the same texts held in memory, against ``fastload convert --from jsonl --tokenizer`` (2 workers),
   and LitData's ``optimize()`` writing the same tokens where it is installed (``pip install litdata
   "torch==2.13.0"``; it brings torchvision, which the project's main venv must not hold: its
   torchvision tests run in a venv of their own, so install it in a separate venv);
3. loading: delivered tokens/s at L = 2048 and 8192 of a NumPy memmap random-window loop over a
   nanoGPT-style ``.bin`` of the same tokens (the floor), against ``fastload.DataLoader(...,
   seq_len=L, packing="concat")``.

Every row runs in the same sitting, rounds interleaved; medians and each ratio are printed and
written as JSON (``--json``). Run no other benchmark beside it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

import numpy as np

PACKAGES = ("python3.11-doc", "debian-reference-en")
DOC_CHARS = 4000


def fetch_text(work: Path) -> Path:
    """WORK/debs/extracted: the documentation packages, downloaded with apt and unpacked."""
    debs = work / "debs"
    extracted = debs / "extracted"
    if extracted.exists():
        return extracted
    debs.mkdir(parents=True, exist_ok=True)
    subprocess.run(["apt-get", "download", *PACKAGES], cwd=debs, check=True)
    for deb in debs.glob("*.deb"):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(extracted)], check=True)
    return extracted


def documents(extracted: Path) -> list[str]:
    """The packages' .txt sources and HTML pages (tags stripped) as documents of at most DOC_CHARS."""
    texts = []
    for path in sorted(extracted.rglob("*")):
        if path.suffix == ".txt" or path.name.endswith(".txt.gz"):
            raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        elif path.suffix == ".html" and "debian-reference" in str(path):
            raw = re.sub(rb"<[^>]+>", b"", path.read_bytes())
        else:
            continue
        texts.append(raw.decode("utf-8", errors="replace"))
    docs = []
    for text in texts:
        current = ""
        for paragraph in text.split("\n\n"):
            if current and len(current) + len(paragraph) > DOC_CHARS:
                docs.append(current)
                current = ""
            current += paragraph + "\n\n"
        if current.strip():
            docs.append(current)
    return docs


def prepare(work: Path) -> tuple[Path, Path, list[str]]:
    corpus, tokenizer_path = work / "corpus.jsonl", work / "tokenizer.json"
    docs = documents(fetch_text(work))
    if not corpus.exists():
        corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    if not tokenizer_path.exists():
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=32000, special_tokens=["<|endoftext|>"], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tokenizer.train_from_iterator(docs, trainer=trainer)
        tokenizer.save(str(tokenizer_path))
    return corpus, tokenizer_path, docs


def time_encode(tokenizer_path: Path, docs: list[str], fast: bool) -> float:
    """Tokens/s of the tokenizer's own batch encoding on all cores (a fresh process: its thread pool unused by a fork)."""
    code = f"""
import json, sys, time
from tokenizers import Tokenizer
docs = [json.loads(l)["text"] for l in open(sys.argv[2])]
t = Tokenizer.from_file(sys.argv[1])
start = time.perf_counter()
n = 0
for i in range(0, len(docs), 2048):
    out = t.{'encode_batch_fast' if fast else 'encode_batch'}(docs[i:i + 2048], add_special_tokens=False)
    n += sum(len(e.ids) for e in out)
print(n / (time.perf_counter() - start))
"""
    corpus = tokenizer_path.with_name("corpus.jsonl")
    return float(subprocess.run([sys.executable, "-c", code, str(tokenizer_path), str(corpus)], check=True, capture_output=True, text=True).stdout)


def time_fastload_convert(work: Path, corpus: Path, tokenizer_path: Path, workers: int) -> tuple[float, Path]:
    out = work / "fastload-tokens"
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "fastload.cli", "convert", str(corpus), str(out), "--from", "jsonl", "--tokenizer",
                    str(tokenizer_path), "--append-eos", "--workers", str(workers), "--shard-tokens", "2M", "--quiet"], check=True,
                   env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    seconds = time.perf_counter() - start
    tokens = json.loads((out / "index.json").read_text())["num_tokens"]
    return tokens / seconds, out


def time_litdata_optimize(work: Path, tokenizer_path: Path, workers: int) -> float | None:
    """Tokens/s of LitData's optimize() tokenizing the same corpus into its token chunks (None when not installed)."""
    code = """
import json, sys, time
from pathlib import Path
import numpy as np
import litdata
from litdata.streaming.item_loader import TokensLoader
from tokenizers import Tokenizer

tok = Tokenizer.from_file(sys.argv[1])
corpus, out, workers = sys.argv[2], sys.argv[3], int(sys.argv[4])
lines = open(corpus).read().splitlines()
parts = [lines[i::workers * 4] for i in range(workers * 4)]

def tokenize(part):
    for line in part:
        ids = tok.encode(json.loads(line)["text"], add_special_tokens=False).ids + [0]
        yield np.asarray(ids, dtype=np.uint16)

if __name__ == "__main__":
    start = time.perf_counter()
    litdata.optimize(fn=tokenize, inputs=parts, output_dir=out, num_workers=workers, chunk_bytes="64MB", item_loader=TokensLoader())
    seconds = time.perf_counter() - start
    n = sum(len(tok.encode(json.loads(l)["text"], add_special_tokens=False).ids) + 1 for l in lines)
    print(n / seconds)
"""
    try:
        import litdata  # noqa: F401
    except ImportError:
        return None
    out = work / "litdata-tokens"
    shutil.rmtree(out, ignore_errors=True)
    script = work / "litdata_optimize.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script), str(tokenizer_path), str(work / "corpus.jsonl"), str(out), str(workers)],
                          capture_output=True, text=True)
    return float(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None


def time_load(dataset: Path, seq_len: int, batch_size: int, batches: int) -> dict[str, float]:
    """Tokens/s of the memmap floor and of fastload's loader, in a fresh process each."""
    floor_code = """
import sys, time, numpy as np, torch
data = np.memmap(sys.argv[1], dtype=np.uint16, mode="r")
L, B, n = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def get_batch():
    ix = torch.randint(len(data) - L - 1, (B,))
    x = torch.stack([torch.from_numpy(data[i:i + L].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + L].astype(np.int64)) for i in ix])
    return x, y
get_batch()
start = time.perf_counter()
for _ in range(n):
    get_batch()
print(n * B * L / (time.perf_counter() - start))
"""
    fastload_code = """
import sys, time, torch, fastload
from fastload.token_loader import TokenDataLoader
L, B, n = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
loader = fastload.DataLoader(sys.argv[1], batch_size=B, seq_len=L, packing="concat")
it = iter(loader)
next(it)
start, got = time.perf_counter(), 0
while got < n:
    try:
        next(it)
    except StopIteration:
        it = iter(loader)
        continue
    got += 1
print(n * B * L / (time.perf_counter() - start))
"""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    binfile = dataset.with_name("nanogpt.bin")
    if not binfile.exists():
        index = json.loads((dataset / "index.json").read_text())
        np.concatenate([np.fromfile(dataset / s["path"], dtype="<u2") for s in index["shards"]]).tofile(binfile)
    out = {}
    for name, code, target in (("numpy memmap floor", floor_code, binfile), ("fastload concat", fastload_code, dataset)):
        done = subprocess.run([sys.executable, "-c", code, str(target), str(seq_len), str(batch_size), str(batches)],
                              capture_output=True, text=True, env=env, check=True)
        out[name] = float(done.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    corpus, tokenizer_path, docs = prepare(args.work)
    print(f"corpus: {len(docs)} documents, {corpus.stat().st_size / 1e6:.1f} MB of JSONL")
    rounds: list[dict[str, float]] = []
    dataset = None
    for r in range(args.rounds):
        row: dict[str, float] = {}
        row["encode_batch"] = time_encode(tokenizer_path, docs, fast=False)
        row["encode_batch_fast"] = time_encode(tokenizer_path, docs, fast=True)
        row["fastload convert"], dataset = time_fastload_convert(args.work, corpus, tokenizer_path, args.workers)
        litdata_rate = time_litdata_optimize(args.work, tokenizer_path, args.workers)
        if litdata_rate is not None:
            row["litdata optimize"] = litdata_rate
        for seq_len in (2048, 8192):
            for name, rate in time_load(dataset, seq_len, args.batch_size, args.batches).items():
                row[f"{name} L={seq_len}"] = rate
        rounds.append(row)
        print(f"round {r}: " + ", ".join(f"{k} {v / 1e6:.2f}M tok/s" for k, v in row.items()))
    medians = {k: median(r[k] for r in rounds) for k in rounds[0]}
    ratios = {
        "convert / encode_batch": [r["fastload convert"] / r["encode_batch"] for r in rounds],
        "convert / encode_batch_fast": [r["fastload convert"] / r["encode_batch_fast"] for r in rounds],
        **({"convert / litdata optimize": [r["fastload convert"] / r["litdata optimize"] for r in rounds]} if "litdata optimize" in rounds[0] else {}),
        **{f"load / floor L={L}": [r[f"fastload concat L={L}"] / r[f"numpy memmap floor L={L}"] for r in rounds] for L in (2048, 8192)},
    }
    for name, values in ratios.items():
        print(f"{name}: median {median(values):.2f} (rounds {', '.join(f'{v:.2f}' for v in values)})")
    if args.json:
        args.json.write_text(json.dumps({"medians": medians, "ratios": ratios, "rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
