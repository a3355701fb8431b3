"""A list of sample keys as a text file: what ``fastload overlap --write-exclude`` writes and the
loader's ``exclude=`` reads. UTF-8, one key a line; a key a plain line cannot hold as it is (one
holding a line break of any kind ``str.splitlines`` knows, or starting with a double quote) is
written as a JSON string, ASCII-escaped, so every key a dataset can hold comes back unchanged.
A file of plain keys, one a line, written by hand reads as it always did."""

from __future__ import annotations

import json
from collections.abc import Iterable

QUOTE = '"'


def format_keys(keys: Iterable[str]) -> str:
    """The file's text for ``keys``, one a line, in their order."""
    return "".join(f"{_line(key)}\n" for key in keys)


def _line(key: str) -> str:
    return json.dumps(key) if key.startswith(QUOTE) or len(f"{key}x".splitlines()) != 1 else key


def parse_keys(text: str, where: str) -> list[str]:
    """The keys of a file's ``text`` (blank lines ignored); a quoted line that is not one JSON
    string is a ValueError naming ``where`` and the line."""
    keys = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith(QUOTE):
            if line:
                keys.append(line)
            continue
        try:
            key = json.loads(line)
        except ValueError:
            key = None
        if not isinstance(key, str):
            raise ValueError(f"{where}: line {number} starts with a double quote but is not one JSON string (a quoted key)")
        keys.append(key)
    return keys
