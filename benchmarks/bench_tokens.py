"""Token data side by side, on real text (Debian's documentation packages: the Python manual's
reStructuredText sources, Perl's pod pages, the PostgreSQL manual, git's and the Debian Reference:
prose and code):

    python benchmarks/bench_tokens.py WORK --rounds 3 --json WORK/result.json --plot WORK/tokens.png

1. WORK/corpus.jsonl: documents (paragraphs gathered to at most 4,000 characters) of the packages'
   text (unless WORK holds one already: ``benchmarks/make_text.py WORK`` writes 326 MB of distinct
   text), and a byte-level BPE tokenizer (32,000 ids) trained on it, on every n-th document of a
   corpus over 64 MB (WORK/tokenizer.json);
2. conversion: the tokenizer's own ``encode_batch`` on all cores over the same texts held in
   memory, and fastokens' ``encode_batch_flat`` (the fast encoder ``--encoder fast`` uses) over
   them, against ``fastload convert --from jsonl --tokenizer`` (2 workers, ``--encoder ENCODER``,
   the process's start included), and LitData's ``optimize()`` writing the same tokens (2 workers;
   the call alone, and its script as a command, from its process's start to the call's return, as
   fastload's command is timed); ``--repeat N`` converts the corpus written N times over (a larger
   corpus, so each command's start is amortised: the same text again, which the encoders' caches
   of words already seen make faster to encode than new text); ``--parts convert-fast`` times
   only fastokens and ``fastload convert`` (on a large corpus the others take minutes a round);
3. loading, delivered tokens/s (``batch * seq_len`` a batch) at L = 2048 and 8192, batch 8, with 0
   and 2 workers, each loader in a fresh process: the floor (nanoGPT's ``get_batch``, random
   windows of a NumPy memmap of a ``.bin`` of the same tokens: in the training process with 0
   workers, as the ``__getitem__`` of a map-style dataset under torch's DataLoader with 2), fastload
   ``concat`` and ``best-fit``, LitData's ``TokensLoader`` under its ``StreamingDataLoader``, and
   Grain's best-fit packing pipeline (documents from the same ``.bin``, shuffled, packed, batched,
   the labels made, in Grain's workers with ``mp_prefetch``);
4. padding at L = 2048 and 8192 over one epoch: fastload best-fit's delivered batches (shuffled,
   and in token order, whose windows are consecutive 4M-token spans), an offline best-fit
   decreasing over those same spans (documents cut at the 64K-token blocks' edges, as fastload
   cuts them), and Grain's best-fit and first-fit packers with as many bins
   as a window holds rows, on the same documents (those longer than L cut into L-long parts, as
   Grain requires and fastload does).

LitData and Grain run in a venv of their own, made here (WORK/peers-venv: ``pip install litdata
grain "torch==2.13.0"``), as LitData brings torchvision, which the project's venv must not hold.
Every row runs in the same sitting, rounds interleaved; medians, each round's ratios and the
spread are printed and written as JSON (``--json``), the loading rates drawn with ``--plot``. Run
no other benchmark beside it (``flock /tmp/fastload-bench.lock ...``).
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
from make_text import fetch_packages

PACKAGES = ("python3.11-doc", "debian-reference-en", "perl-doc", "postgresql-doc-15", "git-doc")
HTML_FROM = ("debian-reference", "postgresql")  # packages whose text is HTML (the others' HTML repeats their .txt)
DOC_CHARS = 4000
VOCAB = 32000
TRAIN_BYTES = 64 << 20  # the tokenizer is trained on about this much of the corpus at most
SEQ_LENS = (2048, 8192)
WORKER_COUNTS = (0, 2)
LOADERS = ("floor", "fastload concat", "fastload best-fit", "litdata TokensLoader", "grain best-fit")
PEERS = ("litdata TokensLoader", "grain best-fit")
WINDOW_TOKENS = 1 << 22  # fastload best-fit's window (fastload.text.token_rows.PACKING_WINDOW)
BLOCK_TOKENS = 1 << 16  # fastload's stream blocks (documents are cut at their edges)
REPO = Path(__file__).resolve().parent.parent


# ---- the corpus --------------------------------------------------------------------------------

def fetch_text(work: Path) -> Path:
    """WORK/debs/extracted: the documentation packages, downloaded with apt and unpacked."""
    return fetch_packages(work / "debs", PACKAGES)


def documents(extracted: Path) -> list[str]:
    """The packages' .txt and .pod sources and (where they hold the text) HTML pages with their
    tags stripped, as documents of paragraphs gathered to at most DOC_CHARS characters."""
    texts = []
    for path in sorted(extracted.rglob("*")):
        name = path.name
        if name.endswith((".txt", ".txt.gz", ".pod")):
            raw = gzip.decompress(path.read_bytes()) if name.endswith(".gz") else path.read_bytes()
        elif name.endswith(".html") and any(p in str(path) for p in HTML_FROM):
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


def prepare(work: Path) -> tuple[Path, Path, int]:
    """WORK/corpus.jsonl and WORK/tokenizer.json (made once); the number of documents."""
    corpus, tokenizer_path = work / "corpus.jsonl", work / "tokenizer.json"
    if not corpus.exists():
        docs = documents(fetch_text(work))
        corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    if not tokenizer_path.exists():
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        docs = [json.loads(line)["text"] for line in corpus.open(encoding="utf-8")]
        every = -(-corpus.stat().st_size // TRAIN_BYTES)  # a large corpus: trained on every n-th document
        docs = docs[::every]
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tokenizer.train_from_iterator(docs, trainer=trainer)
        tokenizer.save(str(tokenizer_path))
    return corpus, tokenizer_path, sum(1 for _ in corpus.open("rb"))


def peers_python(work: Path) -> Path:
    """WORK/peers-venv's python, the venv made (and LitData, Grain installed) on first use."""
    venv = work / "peers-venv"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "litdata", "grain", "torch==2.13.0", "tokenizers"], check=True)
    return python


def checkout_env() -> dict[str, str]:
    """The environment in which child processes import this checkout's fastload."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}


def flat_tokens(dataset: Path) -> tuple[Path, Path]:
    """WORK/nanogpt.bin (every token of the fastload dataset, its shards one after another) and
    WORK/doc_ends.npy (each document's end in it): the same tokens for the floor and Grain."""
    binfile, ends = dataset.with_name("nanogpt.bin"), dataset.with_name("doc_ends.npy")
    index = json.loads((dataset / "index.json").read_text())
    tokens, bounds, base = [], [], 0
    for shard in index["shards"]:
        tokens.append(np.fromfile(dataset / shard["path"], dtype="<u2"))
        offsets = np.fromfile(dataset / shard["table"], dtype="<u8", offset=64).astype(np.int64)
        bounds.append(offsets[1:] + base)
        base += shard["tokens"]
    np.concatenate(tokens).tofile(binfile)
    np.save(ends, np.concatenate(bounds))
    return binfile, ends


# ---- conversion --------------------------------------------------------------------------------

def time_encode(corpus: Path, tokenizer_path: Path) -> float:
    """Tokens/s of the tokenizer's own ``encode_batch`` on all cores over the texts in memory (a fresh process)."""
    code = """
import json, sys, time
from tokenizers import Tokenizer
docs = [json.loads(l)["text"] for l in open(sys.argv[2], encoding="utf-8")]
t = Tokenizer.from_file(sys.argv[1])
start = time.perf_counter()
n = 0
for i in range(0, len(docs), 2048):
    n += sum(len(e.ids) for e in t.encode_batch(docs[i:i + 2048], add_special_tokens=False))
print(n / (time.perf_counter() - start))
"""
    done = subprocess.run([sys.executable, "-c", code, str(tokenizer_path), str(corpus)], check=True, capture_output=True, text=True)
    return float(done.stdout)


def time_fast_encode(corpus: Path, tokenizer_path: Path) -> float:
    """Tokens/s of fastokens' ``encode_batch_flat`` (as ``--encoder fast`` calls it: batches of
    2,048 documents, special-token text as ordinary text) over the texts in memory (a fresh process)."""
    code = """
import json, sys, time
import fastokens
docs = [json.loads(l)["text"] for l in open(sys.argv[2], encoding="utf-8")]
t = fastokens.Tokenizer.from_file(sys.argv[1])
start = time.perf_counter()
n = 0
for i in range(0, len(docs), 2048):
    n += len(t.encode_batch_flat(docs[i:i + 2048], add_special_tokens=False, split_special_tokens=True)[0]) // 4
print(n / (time.perf_counter() - start))
"""
    done = subprocess.run([sys.executable, "-c", code, str(tokenizer_path), str(corpus)], check=True, capture_output=True, text=True)
    return float(done.stdout)


def repeated(work: Path, corpus: Path, times: int) -> Path:
    """WORK/corpus-xN.jsonl: the corpus written ``times`` times over (made once); the corpus itself for 1."""
    if times == 1:
        return corpus
    out = work / f"corpus-x{times}.jsonl"
    if not out.exists():
        data = corpus.read_bytes()
        with open(out, "wb") as f:
            for _ in range(times):
                f.write(data)
    return out


def time_fastload_convert(work: Path, corpus: Path, tokenizer_path: Path, workers: int, encoder: str = "auto",
                          name: str = "fastload-tokens") -> tuple[float, Path]:
    """Tokens/s of ``fastload convert`` (the whole command, its process's start included) and the dataset it wrote (WORK/NAME)."""
    out = work / name
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "fastload.cli", "convert", str(corpus), str(out), "--from", "jsonl", "--tokenizer",
                    str(tokenizer_path), "--append-eos", "--workers", str(workers), "--shard-tokens", "4M", "--quiet",
                    "--encoder", encoder], check=True, env=checkout_env())
    seconds = time.perf_counter() - start
    return json.loads((out / "index.json").read_text())["num_tokens"] / seconds, out


LITDATA_OPTIMIZE = """
import json, sys, time
import numpy as np
import litdata
from litdata.streaming.item_loader import TokensLoader
from tokenizers import Tokenizer

tok = Tokenizer.from_file(sys.argv[1])
corpus, out, workers = sys.argv[2], sys.argv[3], int(sys.argv[4])
lines = [l for l in open(corpus, encoding="utf-8").read().split("\\n") if l]  # not splitlines: a text may hold U+2028
parts = [lines[i::workers * 4] for i in range(workers * 4)]

def tokenize(part):
    for line in part:
        ids = tok.encode(json.loads(line)["text"], add_special_tokens=False).ids + [0]
        yield np.asarray(ids, dtype=np.uint16)

if __name__ == "__main__":
    start = time.perf_counter()
    litdata.optimize(fn=tokenize, inputs=parts, output_dir=out, num_workers=workers, chunk_bytes="64MB", item_loader=TokensLoader())
    seconds, finished = time.perf_counter() - start, time.time()
    n = sum(len(tok.encode(json.loads(l)["text"], add_special_tokens=False).ids) + 1 for l in lines)
    print(n / seconds, n, finished)
"""


def time_litdata_optimize(work: Path, python: Path, corpus: Path, tokenizer_path: Path, workers: int,
                          name: str = "litdata-tokens") -> tuple[float, float]:
    """Tokens/s of LitData's ``optimize()`` tokenizing the same corpus into its token chunks
    (WORK/NAME): of the call alone, and of its script as a command (its process's start
    included, as fastload convert's is)."""
    out = work / name
    shutil.rmtree(out, ignore_errors=True)
    script = work / "litdata_optimize.py"
    script.write_text(LITDATA_OPTIMIZE)
    start = time.time()  # wall clock: the script reports when its optimize() returned (its token count comes after)
    done = subprocess.run([str(python), str(script), str(tokenizer_path), str(corpus), str(out), str(workers)],
                          capture_output=True, text=True, check=True)
    call_rate, tokens, finished = (float(x) for x in done.stdout.strip().splitlines()[-1].split())
    return call_rate, tokens / (finished - start)


# ---- loading: each loader in a child process ---------------------------------------------------

def timed(batches, warmup: int, count: int, tokens_per_batch: int) -> float:
    """Delivered tokens/s over ``count`` batches of the endless iterator ``batches``, after ``warmup``."""
    for _ in range(warmup):
        next(batches)
    start = time.perf_counter()
    for _ in range(count):
        next(batches)
    return count * tokens_per_batch / (time.perf_counter() - start)


def endless(make_iterator):
    """The batches of ``make_iterator()``, started again whenever one ends (an epoch)."""
    while True:
        yield from make_iterator()


def floor_batches(binfile: str, seq_len: int, batch: int, workers: int):
    """nanoGPT's ``get_batch``: random windows of a memmap, inputs and next-token targets as int64."""
    import torch

    class Windows(torch.utils.data.Dataset):
        def __init__(self) -> None:
            self.data: np.ndarray | None = None  # mapped in the process that reads (after the fork)

        def __len__(self) -> int:
            return 1 << 40

        def __getitem__(self, _: int):
            if self.data is None:
                self.data = np.memmap(binfile, dtype=np.uint16, mode="r")
            data = self.data
            ix = torch.randint(len(data) - seq_len - 1, (batch,))
            x = torch.stack([torch.from_numpy(data[i : i + seq_len].astype(np.int64)) for i in ix])
            y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + seq_len].astype(np.int64)) for i in ix])
            return x, y

    windows = Windows()
    if not workers:
        return (windows[0] for _ in iter(int, 1))
    return iter(torch.utils.data.DataLoader(windows, batch_size=None, num_workers=workers, persistent_workers=True))


def fastload_batches(dataset: str, seq_len: int, batch: int, workers: int, packing: str):
    import fastload

    loader = fastload.DataLoader(dataset, batch_size=batch, seq_len=seq_len, packing=packing, num_workers=workers)
    return endless(lambda: iter(loader))


def litdata_batches(chunks: str, seq_len: int, batch: int, workers: int):
    """LitData's TokensLoader blocks of L + 1 under its StreamingDataLoader, split into inputs and targets as litgpt does."""
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    dataset = StreamingDataset(chunks, item_loader=TokensLoader(block_size=seq_len + 1), shuffle=True, drop_last=True)
    loader = StreamingDataLoader(dataset, batch_size=batch, num_workers=workers, drop_last=True)
    for blocks in endless(lambda: iter(loader)):
        yield blocks[:, :-1].long(), blocks[:, 1:].long()


class DocumentParts:
    """Grain's source: the documents of a ``.bin`` (ends in ``doc_ends.npy``), those longer than L
    cut into L-long parts (Grain's packers take nothing longer than the row)."""

    def __init__(self, binfile: str, ends: str, seq_len: int) -> None:
        self.binfile = binfile
        doc_ends = np.load(ends)
        doc_starts = np.concatenate([[0], doc_ends[:-1]])
        parts = -(-(doc_ends - doc_starts) // seq_len)
        owner = np.repeat(np.arange(len(parts)), parts)
        within = np.arange(len(owner)) - np.repeat(np.cumsum(parts) - parts, parts)
        self.starts = doc_starts[owner] + within * seq_len
        self.ends = np.minimum(self.starts + seq_len, doc_ends[owner])
        self.data: np.ndarray | None = None  # mapped in the process that reads

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int):
        data = self.data if self.data is not None else np.memmap(self.binfile, dtype=np.uint16, mode="r")
        self.data = data
        return {"inputs": np.asarray(data[self.starts[i] : self.ends[i]], dtype=np.int32)}


def with_labels(batch: dict) -> dict:
    """A packed batch with its next-token labels: -100 across segments and on padding."""
    inputs, segments = batch["inputs"], batch["inputs_segment_ids"]
    labels = np.full(inputs.shape, -100, dtype=np.int64)
    same = (segments[:, 1:] == segments[:, :-1]) & (segments[:, 1:] != 0)
    labels[:, :-1] = np.where(same, inputs[:, 1:], -100)
    return {"input_ids": inputs.astype(np.int64), "labels": labels, "position_ids": batch["inputs_positions"].astype(np.int64),
            "segment_ids": segments}


def grain_pipeline(binfile: str, ends: str, seq_len: int, batch: int | None, first_fit: bool = False, seed: int = 0):
    """Grain's packing pipeline over the documents: shuffled, packed into rows of L (as many bins as fastload's window holds rows), batched."""
    import grain

    source = grain.MapDataset.source(DocumentParts(binfile, ends, seq_len)).shuffle(seed=seed)
    packer = grain.experimental.FirstFitPackIterDataset if first_fit else grain.experimental.BestFitPackIterDataset
    packed = packer(source.to_iter_dataset(), length_struct={"inputs": seq_len}, num_packing_bins=max(1, WINDOW_TOKENS // seq_len), seed=seed)
    return packed if batch is None else packed.batch(batch).map(with_labels)


def grain_batches(binfile: str, ends: str, seq_len: int, batch: int, workers: int):
    import grain
    import torch

    pipeline = grain_pipeline(binfile, ends, seq_len, batch)
    if workers:
        pipeline = pipeline.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
    for arrays in endless(lambda: iter(pipeline)):
        yield {name: torch.from_numpy(value) for name, value in arrays.items()}


def run_load(args: argparse.Namespace) -> dict:
    """In a child: the delivered tokens/s of one loader (``--loader``)."""
    name, L, B, W = args.loader, args.seq_len, args.batch_size, args.workers
    if name == "floor":
        batches = floor_batches(args.bin, L, B, W)
    elif name.startswith("fastload"):
        batches = fastload_batches(args.dataset, L, B, W, name.split()[1])
    elif name == "litdata TokensLoader":
        batches = litdata_batches(args.chunks, L, B, W)
    else:
        batches = grain_batches(args.bin, args.ends, L, B, W)
    return {"tokens_per_s": timed(batches, args.warmup, args.batches, B * L)}


def run_padding(args: argparse.Namespace) -> dict:
    """In a child: padding over one epoch at ``--seq-len``: fastload best-fit's delivered batches and an
    offline best-fit decreasing over the same windows (main venv), or Grain's packers (peers venv)."""
    L = args.seq_len
    if args.loader == "grain":
        out = {}
        for name, first_fit in (("grain best-fit", False), ("grain first-fit", True)):
            real = slots = 0
            for row in grain_pipeline(args.bin, args.ends, L, None, first_fit=first_fit):
                real += int(np.count_nonzero(row["inputs_segment_ids"]))
                slots += L
            out[name] = 1 - real / slots
        return out
    import fastload
    from fastload.text.packing import best_fit_decreasing

    out = {}
    for name, shuffle in (("fastload best-fit", True), ("fastload best-fit in token order", False)):
        loader = fastload.DataLoader(args.dataset, batch_size=64, seq_len=L, packing="best-fit", shuffle=shuffle, packing_window=WINDOW_TOKENS)
        rows = real = 0
        for batch in loader:
            mask = batch["attention_mask"]
            rows += int(mask.any(dim=1).sum())
            real += int(mask.sum())
        out[name] = 1 - real / (rows * L)
    ends = np.load(args.ends)
    starts, total = np.concatenate([[0], ends[:-1]]), int(ends[-1])
    offline_rows = 0
    for lo in range(0, total, WINDOW_TOKENS):  # a span's documents cut at the stream's block edges, as fastload's are
        block_edges = np.arange(lo, min(lo + WINDOW_TOKENS, total), BLOCK_TOKENS)
        inside = np.concatenate([np.minimum(ends, b + BLOCK_TOKENS) - np.maximum(starts, b) for b in block_edges])
        inside = inside[inside > 0]
        parts = np.concatenate([np.full(int(n // L), L) for n in inside] + [inside[inside % L > 0] % L])
        offline_rows += len(best_fit_decreasing(np.sort(parts)[::-1], L))
    return {**out, "offline best-fit decreasing over the same spans": 1 - total / (offline_rows * L)}


def child(python: Path, args: list[str]) -> dict:
    """Run this script as a child (``python``: the main or the peers' venv) and read its JSON answer."""
    done = subprocess.run([str(python), __file__, *args], capture_output=True, text=True, env=checkout_env())
    if done.returncode:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---- the sitting -------------------------------------------------------------------------------

def spread(values: list[float]) -> str:
    """Median and the range of ``values``."""
    return f"{median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def plot(path: Path, medians: dict[str, float]) -> None:
    """Bars of each loader's median delivered tokens/s, grouped by (L, workers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [(L, W) for L in SEQ_LENS for W in WORKER_COUNTS]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(LOADERS)
    for k, name in enumerate(LOADERS):
        values = [medians.get(f"{name} L={L} W={W}", 0) / 1e6 for L, W in groups]
        ax.bar([g + k * width for g in range(len(groups))], values, width, label=name)
    ax.set_xticks([g + width * (len(LOADERS) - 1) / 2 for g in range(len(groups))], [f"L={L}, {W} workers" for L, W in groups])
    ax.set_ylabel("delivered tokens/s (millions)")
    ax.set_title("Token loaders on real text, batch 8 (benchmarks/bench_tokens.py)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parts", default="convert,load,padding",
                        help="comma-separated: convert, load, padding; or convert-fast (fastload convert and fastokens only)")
    parser.add_argument("--convert-workers", type=int, default=2)
    parser.add_argument("--encoder", default="auto", choices=("auto", "fast", "tokenizers"), help="fastload convert's --encoder")
    parser.add_argument("--repeat", type=int, default=1, help="convert the corpus written this many times over")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--batches", type=int, default=300, help="timed batches a loader (after the warm-up)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    for name in ("child", "loader", "dataset", "chunks", "bin", "ends"):
        parser.add_argument(f"--{name}", help=argparse.SUPPRESS)
    parser.add_argument("--seq-len", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_load(args) if args.child == "load" else run_padding(args)))
        return
    parts = set(args.parts.split(","))
    converting = bool(parts & {"convert", "convert-fast"})
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    corpus, tokenizer_path, count = prepare(work)
    print(f"corpus: {count} documents, {corpus.stat().st_size / 1e6:.1f} MB of JSONL")
    converted = repeated(work, corpus, args.repeat)
    if converting:
        print(f"converted: {converted.stat().st_size / 1e6:.1f} MB of JSONL ({args.repeat} x the corpus)")
    peers, common = Path(sys.executable), []
    if parts & {"convert", "load", "padding"}:  # LitData's venv, and the datasets the loaders read
        peers = peers_python(work)
        dataset, chunks = work / "fastload-tokens", work / "litdata-tokens"
        if not (dataset / "index.json").exists():
            time_fastload_convert(work, corpus, tokenizer_path, args.convert_workers)
        if not chunks.exists():
            time_litdata_optimize(work, peers, corpus, tokenizer_path, args.convert_workers)
        binfile, ends = flat_tokens(dataset)
        print(f"tokens: {int(np.load(ends)[-1]):,}")
        common = ["--dataset", str(dataset), "--chunks", str(chunks), "--bin", str(binfile), "--ends", str(ends)]
    rounds: list[dict[str, float]] = []
    for r in range(args.rounds):
        row: dict[str, float] = {}
        if converting:
            if "convert" in parts:
                row["encode_batch"] = time_encode(converted, tokenizer_path)
            row["fastokens encode_batch_flat"] = time_fast_encode(converted, tokenizer_path)
            row["fastload convert"], _ = time_fastload_convert(work, converted, tokenizer_path, args.convert_workers, args.encoder,
                                                               "fastload-convert")  # the loaders keep reading fastload-tokens
            if "convert" in parts:
                row["litdata optimize()"], row["litdata optimize script"] = time_litdata_optimize(work, peers, converted, tokenizer_path,
                                                                                                args.convert_workers, "litdata-convert")
        if "load" in parts:
            for L in SEQ_LENS:
                for W in WORKER_COUNTS:
                    for name in LOADERS:
                        python = peers if name in PEERS else Path(sys.executable)
                        answer = child(python, ["x", "--child", "load", "--loader", name, "--seq-len", str(L), "--workers", str(W),
                                                "--batch-size", str(args.batch_size), "--batches", str(args.batches),
                                                "--warmup", str(args.warmup), *common])
                        row[f"{name} L={L} W={W}"] = answer["tokens_per_s"]
        if "padding" in parts and r == 0:  # the same in every round: one
            for L in SEQ_LENS:
                for python, name in ((Path(sys.executable), "fastload"), (peers, "grain")):
                    for key, value in child(python, ["x", "--child", "padding", "--loader", name, "--seq-len", str(L), *common]).items():
                        row[f"padding {key} L={L}"] = value
        rounds.append(row)
        print(f"round {r}: " + ", ".join(f"{k} {v / 1e6:.2f}M" if v > 1 else f"{k} {100 * v:.2f}%" for k, v in row.items()), flush=True)
    medians = {k: median(r[k] for r in rounds if k in r) for k in rounds[0]}
    ratios: dict[str, list[float]] = {}
    if converting:
        ratios["convert / fastokens encode_batch_flat"] = [r["fastload convert"] / r["fastokens encode_batch_flat"] for r in rounds]
    if "convert" in parts:
        ratios["convert / encode_batch"] = [r["fastload convert"] / r["encode_batch"] for r in rounds]
        ratios["convert / litdata optimize()"] = [r["fastload convert"] / r["litdata optimize()"] for r in rounds]
        ratios["convert / litdata optimize script"] = [r["fastload convert"] / r["litdata optimize script"] for r in rounds]
    if "load" in parts:
        for L in SEQ_LENS:
            for W in WORKER_COUNTS:
                at = f"L={L} W={W}"
                for mine, theirs in (("fastload concat", "floor"), ("fastload best-fit", "floor"), ("fastload concat", "litdata TokensLoader"),
                                     ("fastload best-fit", "grain best-fit")):
                    ratios[f"{mine} / {theirs} {at}"] = [r[f"{mine} {at}"] / r[f"{theirs} {at}"] for r in rounds]
                for peer in PEERS:
                    ratios[f"{peer} / floor {at}"] = [r[f"{peer} {at}"] / r[f"floor {at}"] for r in rounds]
    for name, values in ratios.items():
        print(f"{name}: median {spread(values)} (rounds {', '.join(f'{v:.2f}' for v in values)})")
    for key, value in medians.items():
        if key.startswith("padding"):
            print(f"{key}: {100 * value:.2f}%")
    if args.json:
        args.json.write_text(json.dumps({"medians": medians, "ratios": ratios, "rounds": rounds}, indent=1))
    if args.plot and "load" in parts:
        plot(args.plot, medians)


if __name__ == "__main__":
    main()
