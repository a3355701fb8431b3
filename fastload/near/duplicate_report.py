"""A duplicate report to look at: each group of near duplicates as one row of thumbnails, the
kept (or, for ``overlap``, the first dataset's) image first, framed green, its duplicates after
it framed red with their distance in bits. Pillow only. A PNG (its text chunk ``fastload-groups``
says how many groups it shows), or, for a path ending ``.html``, one self-contained page (the
thumbnails inline as ``data:`` JPEGs; ``<meta name="fastload-groups">`` says how many)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from fastload.errors import SampleError

if TYPE_CHECKING:  # Pillow and numpy only when a report is drawn
    import numpy as np
    from PIL import Image, ImageDraw

THUMB = 112  # px, a thumbnail's longer side
MAX_GROUPS = 60  # rows drawn in a PNG; the title says how many more there were
HTML_MAX_GROUPS = 1000  # rows of an HTML page (it scrolls)
MAX_TILES = 8  # thumbnails per row; "+N" after them for bigger groups
PAD, TEXT = 6, 12
KEPT, DROPPED, BACKGROUND, INK = (40, 160, 60), (200, 40, 40), (245, 245, 245), (20, 20, 20)
GROUPS_CHUNK = "fastload-groups"

Ref = TypeVar("Ref")


@dataclass(frozen=True)
class Tile(Generic[Ref]):
    """One image of a group: how to load it (``ref``), its caption, its distance to the group's
    first image (None for that first one)."""

    ref: Ref
    caption: str
    distance: int | None = None


def _thumbnail(data: bytes | np.ndarray, where: str) -> Image.Image:
    """The image shrunk to fit THUMB x THUMB, from a reduced decode where the format allows it."""
    from PIL import Image

    from fastload.decode.cpu import decode_image

    pixels = data if not isinstance(data, bytes) else decode_image(data, where, THUMB, THUMB)
    if pixels.ndim == 3 and pixels.shape[2] == 1:  # grey pixels (an npz source): Pillow takes them as H x W
        pixels = pixels[:, :, 0]
    image = Image.fromarray(pixels).convert("RGB")
    image.thumbnail((THUMB, THUMB), Image.Resampling.BILINEAR)
    return image


def draw_groups(
    path: str | Path, title: str, groups: Sequence[Sequence[Tile[Ref]]], load: Callable[[Ref], bytes | np.ndarray], first: str = "kept"
) -> int:
    """Write ``groups`` (each: its first image, noted ``first``, then its duplicates) at ``path``:
    a PNG of the first MAX_GROUPS, or an HTML page of the first HTML_MAX_GROUPS where ``path``
    ends .html; returns how many it drew. ``load`` gives a tile's encoded image or pixels; one
    that fails (a SampleError) is drawn as an empty frame."""
    if str(path).lower().endswith((".html", ".htm")):
        return _write_html(Path(path), title, groups, load, first)
    from PIL import Image, ImageDraw, PngImagePlugin

    shown = groups[:MAX_GROUPS]
    cell_w, cell_h = THUMB + 2 * PAD, THUMB + 2 * PAD + 2 * TEXT
    longest = max((len(group) for group in shown), default=1)
    width = max(480, cell_w * (min(longest, MAX_TILES) + (longest > MAX_TILES)))
    sheet = Image.new("RGB", (width, 2 * TEXT + cell_h * max(1, len(shown))), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    more = f" (the first {len(shown)} drawn)" if len(groups) > len(shown) else ""
    draw.text((PAD, 4), f"{title}: {len(groups)} groups{more}", fill=INK)
    for row, group in enumerate(shown):
        top = 2 * TEXT + row * cell_h
        for column, tile in enumerate(group[:MAX_TILES]):
            left = column * cell_w
            _draw_tile(sheet, draw, tile, load, left, top, first)
        if len(group) > MAX_TILES:
            draw.text((MAX_TILES * cell_w + PAD, top + THUMB // 2), f"+{len(group) - MAX_TILES}", fill=INK)
    info = PngImagePlugin.PngInfo()
    info.add_text(GROUPS_CHUNK, str(len(shown)))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    sheet.save(path, format="PNG", pnginfo=info)
    return len(shown)


def _draw_tile(
    sheet: Image.Image, draw: ImageDraw.ImageDraw, tile: Tile[Ref], load: Callable[[Ref], bytes | np.ndarray], left: int, top: int, first: str
) -> None:
    """One framed thumbnail with its caption (the key) and its distance under it."""
    colour = KEPT if tile.distance is None else DROPPED
    draw.rectangle((left + 2, top + 2, left + THUMB + 2 * PAD - 3, top + THUMB + 2 * PAD - 3), outline=colour, width=3)
    try:
        thumb = _thumbnail(load(tile.ref), tile.caption)
        sheet.paste(thumb, (left + PAD + (THUMB - thumb.width) // 2, top + PAD + (THUMB - thumb.height) // 2))
    except SampleError:
        draw.text((left + PAD + 4, top + THUMB // 2), "unreadable", fill=DROPPED)
    caption = tile.caption if len(tile.caption) <= 20 else "..." + tile.caption[-17:]
    draw.text((left + PAD, top + THUMB + 2 * PAD), caption, fill=INK)
    note = first if tile.distance is None else f"{tile.distance} bits"
    draw.text((left + PAD, top + THUMB + 2 * PAD + TEXT), note, fill=colour)


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="fastload-groups" content="{shown}"><title>{title}</title>
<style>body{{font:13px sans-serif;background:#f5f5f5;color:#141414}} .group{{display:flex;flex-wrap:wrap;gap:6px;margin:8px 0}}
figure{{margin:0;width:{thumb}px}} img,.none{{width:{thumb}px;height:{thumb}px;object-fit:contain;border:3px solid;background:#fff}}
.kept img,.kept .none{{border-color:#28a03c}} .dup img,.dup .none{{border-color:#c82828}} figcaption{{overflow-wrap:anywhere}}</style>
</head><body><h1>{title}: {count} groups{more}</h1>
{rows}
</body></html>
"""


def _write_html(path: Path, title: str, groups: Sequence[Sequence[Tile[Ref]]], load: Callable[[Ref], bytes | np.ndarray], first: str) -> int:
    """The page of the first HTML_MAX_GROUPS groups, one row of figures each."""
    import base64
    import html
    import io

    def figure(tile: Tile[Ref]) -> str:
        note = first if tile.distance is None else f"{tile.distance} bits"
        try:
            jpeg = io.BytesIO()
            _thumbnail(load(tile.ref), tile.caption).save(jpeg, format="JPEG", quality=85)
            picture = f'<img alt="{html.escape(tile.caption)}" src="data:image/jpeg;base64,{base64.b64encode(jpeg.getvalue()).decode()}">'
        except SampleError:
            picture = '<div class="none">unreadable</div>'
        kind = "kept" if tile.distance is None else "dup"
        return f'<figure class="{kind}">{picture}<figcaption>{html.escape(tile.caption)}<br>{note}</figcaption></figure>'

    shown = groups[:HTML_MAX_GROUPS]
    rows = "\n".join(f'<div class="group">{"".join(figure(tile) for tile in group)}</div>' for group in shown)
    more = f" (the first {len(shown)} shown)" if len(groups) > len(shown) else ""
    page = _PAGE.format(shown=len(shown), title=html.escape(title), count=len(groups), more=more, rows=rows, thumb=THUMB)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return len(shown)
