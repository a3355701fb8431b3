"""A large corpus of distinct real text (WORK/corpus.jsonl) from Debian's documentation packages,
for measuring a conversion whose start-up is amortised without repeating text (which every
encoder's cache of words already seen would make cheaper than new text):

    python benchmarks/make_text.py data/tokdistinct
    python benchmarks/bench_tokens.py data/tokdistinct --parts convert-fast --rounds 3 --encoder fast

Sources (fetched with ``apt-get download`` and unpacked with ``dpkg-deb -x``, as make_photos.py
does): the manuals of Linux, Python, Perl, PostgreSQL, git, Erlang, SQLite, Apache, Django,
SQLAlchemy, pandas, SciPy, SymPy, Sphinx, Node.js, Octave, Maxima, Vim, zsh, bash, GIMP and
LibreOffice, the Debian Reference and the Debian Administrator's Handbook (in its translations),
the Linux man pages, and two dictionaries (GCIDE, WordNet). Their text: ``.txt``, ``.rst``,
``.pod``, ``.md`` files, dictd dictionaries and man pages (roff requests and font escapes
dropped), and HTML pages with their scripts, styles and tags stripped and entities decoded.
Every paragraph (text between blank lines) is kept only the first time it occurs across all the
packages (a manual's HTML page and its source, licences, navigation lines), and each file's
paragraphs are gathered into documents of at most 4,000 characters (a longer paragraph cut
at line ends), one JSON object a line
(``{"text": ...}``, non-ASCII written as itself). The packages' text as of Debian 12, 2026-12-05:
311.8 MB of distinct paragraphs, 326.2 MB of JSONL (106,509 documents).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import html
import json
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

PACKAGES = ("linux-doc-6.1", "python3.11-doc", "perl-doc", "postgresql-doc-15", "git-doc", "debian-reference-en",
            "debian-handbook", "erlang-doc", "sqlite3-doc", "apache2-doc", "python-django-doc", "python-sqlalchemy-doc",
            "python-pandas-doc", "python-scipy-doc", "python-sympy-doc", "sphinx-doc", "nodejs-doc", "octave-doc",
            "maxima-doc", "vim-doc", "zsh-doc", "bash-doc", "gimp-help-en", "libreoffice-help-en-us", "manpages",
            "manpages-dev", "dict-gcide", "dict-wn")
DOC_CHARS = 4000
TEXT_SUFFIXES = (".txt", ".rst", ".pod", ".md", ".dict.dz")  # plain text (.gz and dictd's .dz decompressed)
HTML_SUFFIXES = (".html", ".htm", ".xhtml")
SCRIPTS = re.compile(rb"<(script|style)\b.*?</\1\s*>", re.S | re.I)
TAGS = re.compile(rb"<[^>]*>")
ROFF_ESCAPES = re.compile(r"\\f[BIRPC]|\\f\(..|\\\(..|\\[&-]|\\s[-+]?\d")
PARAGRAPHS = re.compile(r"\n[ \t\r\f\v]*\n")


def fetch_packages(debs: Path, packages: tuple[str, ...]) -> Path:
    """DEBS/extracted: ``packages`` downloaded with apt (once) and each unpacked into a folder of its name."""
    extracted = debs / "extracted"
    missing = [p for p in packages if not any(debs.glob(f"{p}_*.deb"))]
    if missing:
        debs.mkdir(parents=True, exist_ok=True)
        subprocess.run(["apt-get", "download", *missing], cwd=debs, check=True)
        shutil.rmtree(extracted, ignore_errors=True)
    if not extracted.exists():
        for package in packages:
            deb = next(debs.glob(f"{package}_*.deb"))
            subprocess.run(["dpkg-deb", "-x", str(deb), str(extracted / package)], check=True)
    return extracted


def file_text(path: Path) -> str | None:
    """The text of one file of a package (None: a file holding no text this corpus takes)."""
    name = path.name
    plain = name[:-3] if name.endswith(".gz") else name
    is_html, is_text = plain.endswith(HTML_SUFFIXES), plain.endswith(TEXT_SUFFIXES)
    is_man = "/man/" in path.as_posix() and name.endswith(".gz")
    if not (is_html or is_text or is_man):
        return None
    raw = path.read_bytes()
    if name.endswith((".gz", ".dz")):  # dictd's .dict.dz is gzip
        raw = gzip.decompress(raw)
    if is_html:
        return html.unescape(TAGS.sub(b"", SCRIPTS.sub(b"", raw)).decode("utf-8", errors="replace"))
    text = raw.decode("utf-8", errors="replace")
    if is_man and not is_text:
        text = ROFF_ESCAPES.sub("", "\n".join(line for line in text.splitlines() if not line.startswith((".", "'"))))
    return text


def distinct_documents(extracted: Path, stats: Counter) -> Iterator[str]:
    """Documents of each file's paragraphs seen nowhere before (in path order), gathered to at
    most DOC_CHARS characters; ``stats`` counts each package's distinct and total bytes."""
    seen: set[bytes] = set()
    for path in sorted(p for p in extracted.rglob("*") if p.is_file()):
        text = file_text(path)
        if text is None:
            continue
        package = path.relative_to(extracted).parts[0]
        current = ""
        for paragraph in PARAGRAPHS.split(text.replace("\r\n", "\n")):
            paragraph = "\n".join(line.rstrip() for line in paragraph.strip("\n").splitlines())
            if not paragraph.strip():
                continue
            size = len(paragraph.encode())
            stats[package, "total"] += size
            digest = hashlib.blake2b(paragraph.encode(), digest_size=16).digest()
            if digest in seen:
                continue
            seen.add(digest)
            stats[package, "distinct"] += size
            for piece in pieces(paragraph):
                if current and len(current) + len(piece) > DOC_CHARS:
                    yield current
                    current = ""
                current += piece + "\n\n"
        if current:
            yield current


def pieces(paragraph: str) -> list[str]:
    """``paragraph`` whole, or one longer than DOC_CHARS (a dictionary's entries with no blank
    line between them) cut at line ends into pieces of at most DOC_CHARS (a longer line cut)."""
    if len(paragraph) <= DOC_CHARS:
        return [paragraph]
    out, current = [], ""
    for line in paragraph.split("\n"):
        for start in range(0, max(len(line), 1), DOC_CHARS):
            part = line[start : start + DOC_CHARS]
            if current and len(current) + 1 + len(part) > DOC_CHARS:
                out.append(current)
                current = ""
            current = f"{current}\n{part}" if current else part
    return [*out, current] if current else out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work", type=Path, help="WORK: writes WORK/corpus.jsonl (the packages under WORK/debs)")
    args = parser.parse_args()
    work = args.work.resolve()
    extracted = fetch_packages(work / "debs", PACKAGES)
    stats: Counter = Counter()
    corpus = work / "corpus.jsonl"
    documents = 0
    with open(corpus.with_suffix(".part"), "w", encoding="utf-8") as f:
        for document in distinct_documents(extracted, stats):
            f.write(json.dumps({"text": document}, ensure_ascii=False) + "\n")
            documents += 1
    corpus.with_suffix(".part").replace(corpus)
    for package in sorted(PACKAGES, key=lambda p: -stats[p, "distinct"]):
        print(f"{package:24s} {stats[package, 'distinct'] / 1e6:6.1f} MB distinct of {stats[package, 'total'] / 1e6:6.1f} MB")
    distinct = sum(stats[p, "distinct"] for p in PACKAGES)
    print(f"{corpus}: {documents} documents, {distinct / 1e6:.1f} MB of distinct paragraphs, {corpus.stat().st_size / 1e6:.1f} MB of JSONL")


if __name__ == "__main__":
    main()
