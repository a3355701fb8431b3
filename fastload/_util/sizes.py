"""Byte sizes as people write them (256MB, 1.5G, 64KiB), for shard sizes and cache limits."""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Parse '256MB', '1.5G', '64KiB' or '1000' into bytes (KB/MB/GB decimal, KiB/MiB/GiB binary)."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"cannot parse size {text!r} (examples: 256MB, 1GiB, 500000)")
    number, unit = float(match.group(1)), match.group(2).upper()
    prefix = unit[:1] if unit[:1] in ("K", "M", "G", "T") else ""
    if not prefix:
        return int(number)
    return int(number * (1024 if "I" in unit else 1000) ** ("KMGT".index(prefix) + 1))
