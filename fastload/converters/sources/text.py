"""Plain text files as documents (``--from text``): every regular file under a folder (or one
file) is one document, its whole UTF-8 text; files in path order."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fastload.converters.sample import SourceItem, file_stamp, make_key, unique_keys
from fastload.converters.sources import Document, SourceOptions, decode_text, inside_source
from fastload.converters.sources.imagefolder import read_file


@dataclass(frozen=True)
class TextFileSource:
    """Text files, one document each."""

    files: tuple[Path, ...]
    root: Path
    classes: tuple[str, ...] | None = None

    def items(self) -> list[SourceItem]:
        """One item a file, keyed by its path under the root."""
        keys = unique_keys([make_key(f.relative_to(self.root).as_posix()) for f in self.files])
        return [SourceItem(key=key, where=str(f), size_hint=f.stat().st_size, ref=f, stamp=file_stamp(f))
                for key, f in zip(keys, self.files)]

    def documents(self, item: SourceItem) -> Iterator[Document]:
        """The file's text (an empty file or invalid UTF-8 reported, not raised)."""
        try:
            data = read_file(str(item.ref), item.size_hint)
        except OSError as exc:
            yield Document(item.where, None, f"unreadable: {exc.strerror or exc}")
            return
        text, problem = decode_text(data)
        if text is not None and not text.strip():
            text, problem = None, "empty document"
        yield Document(item.where, text, problem)


def open_source(path: str, options: SourceOptions) -> TextFileSource:
    """Open a text file, or every regular file under a folder (hidden ones left out; one linked
    from outside it refused, unless ``follow_symlinks``)."""
    p = Path(path)
    if p.is_dir():
        files = tuple(inside_source(p, f, options.follow_symlinks) for f in sorted(p.rglob("*"))
                      if f.is_file() and not any(part.startswith(".") for part in f.relative_to(p).parts))
        root = p
    else:
        files, root = (p,), p.parent
    if not files or not files[0].is_file():
        raise FileNotFoundError(f"{path}: no text files")
    return TextFileSource(files=files, root=root)
