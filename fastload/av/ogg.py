"""Ogg Vorbis streams read without a demuxer: the pages walked by their headers (capture pattern,
granule position, segment table), the three Vorbis header packets gathered for the decoder, the
page a crop starts after found by bisection over the bytes on the granule positions, and the
packets from there rebuilt from the segments' lacing, for fastload.av.pyav to feed a bare Vorbis
decoder (no container opened, no seek through a file object).

Decoding a Vorbis packet gives the samples from the middle of the previous packet's window to the
middle of its own, so the packet that ends a page is fed first: it gives nothing (a decoder's first
packet only fills its overlap), and the next packet's samples start at that page's granule
position. Only plain streams are read here: one logical stream whose headers fill their own pages,
each page following the last; anything else (chained or multiplexed streams, bytes between pages,
a packet of a page's own making that began pages back) raises NotPlain, and the demuxer reads it
as before. Nothing is allocated from a declared size: a page is used only once its header, segment
table and body are inside the bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

CAPTURE = b"OggS"
_PAGE = struct.Struct("<4sBBqIIIB")  # capture, version, flags, granule position, serial, page number, CRC, segments
CONTINUED, FIRST, LAST = 1, 2, 4  # a page's flags: its first packet began on the page before; the stream's first; its last
VORBIS_HEADERS = (b"\x01vorbis", b"\x03vorbis", b"\x05vorbis")  # identification, comment, setup
SCAN_BYTES = 16384  # below this span the bisection gives way to walking the pages one by one


class NotPlain(Exception):
    """The bytes are not a plain Ogg Vorbis stream this module reads (the demuxer reads it instead)."""


@dataclass(frozen=True)
class Page:
    """One page: where it starts, its flags and granule position (-1: no packet ends on it), its
    segment table, and where its body starts and ends."""

    at: int
    flags: int
    granule: int
    lacing: bytes
    body: int
    end: int

    def last_packet(self) -> int | None:
        """The segment where the last packet ending on this page begins; None when none ends on it
        or it began on an earlier page."""
        ends = [i for i, size in enumerate(self.lacing) if size < 255]
        if not ends:
            return None
        begin = ends[-2] + 1 if len(ends) > 1 else 0
        if (begin == 0 and self.flags & CONTINUED) or (begin == ends[-1] and not self.lacing[begin]):
            return None  # begun pages back, or empty (a decoder never sees it, so it cannot start one)
        return begin


def page_at(data: bytes, at: int, serial: int | None) -> Page | None:
    """The page starting at byte ``at`` of ``data``, of stream ``serial`` (None: any); None when there
    is none there, or it does not fit in the bytes."""
    if at < 0 or at + _PAGE.size > len(data):
        return None
    capture, version, flags, granule, found, _, _, segments = _PAGE.unpack_from(data, at)
    if capture != CAPTURE or version != 0 or flags > 7 or (serial is not None and found != serial):
        return None
    body = at + _PAGE.size + segments
    if body > len(data):
        return None
    lacing = data[at + _PAGE.size : body]
    end = body + sum(lacing)
    return Page(at, flags, granule, lacing, body, end) if end <= len(data) else None


@dataclass(frozen=True)
class VorbisStream:
    """A plain Ogg Vorbis stream: its serial number, its three header packets, its rate and channels
    (the identification header's) and the first byte of its first audio page."""

    serial: int
    headers: tuple[bytes, bytes, bytes]
    rate: int
    channels: int
    audio: int

    def extradata(self) -> bytes:
        """The headers as FFmpeg's Vorbis decoder takes them: Xiph lacing (2, the first two sizes in 255s, then the three)."""
        sizes = b"".join(b"\xff" * (len(h) // 255) + bytes([len(h) % 255]) for h in self.headers[:2])
        return b"\x02" + sizes + b"".join(self.headers)


def vorbis_stream(data: bytes) -> VorbisStream:
    """The plain Ogg Vorbis stream in ``data``: its identification header alone on the first page,
    the comment and setup headers on the pages after it, the setup ending its page; NotPlain otherwise."""
    first = page_at(data, 0, None)
    if first is None or first.flags != FIRST or first.granule != 0 or first.lacing[-1:] == b"\xff" or first.lacing.count(255) + 1 != len(first.lacing):
        raise NotPlain  # the identification header is one packet, alone on the stream's first page
    serial = _PAGE.unpack_from(data, 0)[4]
    ident = bytes(data[first.body : first.end])
    if len(ident) < 30 or not ident.startswith(VORBIS_HEADERS[0]):
        raise NotPlain
    channels, rate = ident[11], int.from_bytes(ident[12:16], "little")
    headers: list[bytes] = [ident]
    parts: list[bytes] = []
    page, at = first, first.end
    while len(headers) < 3:
        page = page_at(data, at, serial) or _not_plain()
        if bool(page.flags & CONTINUED) != bool(parts) or page.flags & (FIRST | LAST) or page.granule not in (0, -1):
            raise NotPlain
        offset = page.body
        for size in page.lacing:
            parts.append(data[offset : offset + size])
            offset += size
            if size < 255:
                if len(headers) == 3:  # an audio packet on the setup header's page
                    raise NotPlain
                headers.append(b"".join(parts))
                parts = []
        at = page.end
    if parts or not all(h.startswith(tag) for h, tag in zip(headers, VORBIS_HEADERS)):
        raise NotPlain
    return VorbisStream(serial, (headers[0], headers[1], headers[2]), rate, channels, at)


def _not_plain() -> Page:
    """Raise NotPlain (where a page was expected and there is none)."""
    raise NotPlain


def _next_page(data: bytes, stream: VorbisStream, page: Page) -> Page | None:
    """The page after ``page``: None at the end of the bytes; NotPlain where something else follows
    (another stream chained after this one's last page, or bytes that are no page of it)."""
    if page.end == len(data):
        return None
    if page.flags & LAST:
        raise NotPlain
    return page_at(data, page.end, stream.serial) or _not_plain()


def _page_from(data: bytes, stream: VorbisStream, start: int, stop: int) -> Page | None:
    """The first page of ``stream`` beginning in bytes ``start`` to ``stop`` that the next page (or
    the end of the bytes) follows, with a granule position; None if none."""
    at = data.find(CAPTURE, start, stop)
    while at >= 0:
        page = page_at(data, at, stream.serial)
        if page is not None and (page.end == len(data) or data.startswith(CAPTURE, page.end)):
            while page is not None and page.granule == -1:
                page = page_at(data, page.end, stream.serial)
            return page
        at = data.find(CAPTURE, at + 1, stop)
    return None


def crop_start(data: bytes, stream: VorbisStream, granule: int) -> tuple[Page, int, int | None]:
    """Where to start decoding for the sample at granule position ``granule``: (a page, the segment
    its packet to feed first begins at, the granule position of the first sample decoded). That is
    the last page whose granule position is at most ``granule`` and whose last packet begins on it
    (that packet primes the decoder, and the samples after start at the page's granule position),
    or the stream's first audio packet (None: its first sample is the stream's first). Bisection over
    the bytes, then page by page."""
    low, high = stream.audio, len(data)
    while high - low > SCAN_BYTES:
        middle = (low + high) // 2
        found_at = _page_from(data, stream, middle, high)
        if found_at is None or found_at.granule > granule:
            high = middle
        else:
            low = found_at.at
    found: tuple[Page, int, int | None] | None = None
    page: Page | None = page_at(data, low, stream.serial) or _not_plain()
    while page is not None and page.granule <= granule:
        if page.granule >= 0:
            segment = page.last_packet()
            if segment is not None:
                found = (page, segment, page.granule)
        page = _next_page(data, stream, page)
    if found is not None:
        return found
    if low != stream.audio:
        raise NotPlain  # every page from the bisection's on continues a packet begun earlier
    return page_at(data, stream.audio, stream.serial) or _not_plain(), 0, None


def packets(data: bytes, stream: VorbisStream, page: Page, segment: int) -> Iterator[tuple[bytes, int | None]]:
    """Each packet from segment ``segment`` of ``page`` on, with the granule position of the page it
    ends where it is the last to end on a page that is not the stream's last (else None); empty packets are left out."""
    parts: list[bytes] = []
    current: Page | None = page
    while current is not None:
        offset = current.body + sum(current.lacing[:segment])
        last = max((i for i, size in enumerate(current.lacing) if size < 255), default=-1)
        for i in range(segment, len(current.lacing)):
            size = current.lacing[i]
            parts.append(data[offset : offset + size])
            offset += size
            if size < 255:
                packet = b"".join(parts)
                parts = []
                anchor = current.granule if i == last and not current.flags & LAST else None
                if packet:
                    yield packet, anchor
        current = _next_page(data, stream, current)
        if current is not None and bool(current.flags & CONTINUED) != bool(parts):
            raise NotPlain
        segment = 0
