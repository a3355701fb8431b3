"""Near duplicates: ``convert --dedupe near`` drops planted near copies and keeps distinct photos,
the same survivors for any worker count, reported in duplicates.jsonl and drawn by --report;
``overlap`` finds B's samples near A's and writes their keys; ``inspect`` shows the class balance.
All on real JPEG files written by the fixture."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageEnhance

import fastload
from fastload import transforms as T
from fastload.converters import ConvertOptions, convert
from fastload.formats.index import DatasetIndex, write_index
from fastload.formats.key_list import format_keys, parse_keys
from fastload.formats.writing import PreparedSample, WriterOptions, open_writer
from fastload.loading.loader_orders import read_exclude
from fastload.near import search
from fastload.near.duplicate_report import GROUPS_CHUNK
from fastload.near.search import MultiIndex, first_occurrences
from fastload.near.signature import COLOUR_TOLERANCE, colours_match, hamming, signatures
from tests.conftest import jpeg_bytes, run_cli, tree_bytes

DISTINCT = 30


def texture(seed: int, size: tuple[int, int] = (300, 400)) -> Image.Image:
    """A photo-like image: random colour fields at a few scales, smoothly upsampled (height, width)."""
    rng = np.random.default_rng(seed)
    height, width = size
    out = np.zeros((height, width, 3), dtype=np.float32)
    for cells, weight in ((4, 0.6), (12, 0.3), (40, 0.1)):
        small = Image.fromarray((rng.random((cells, cells, 3)) * 255).astype(np.uint8))
        out += weight * np.asarray(small.resize((width, height), Image.Resampling.BICUBIC), dtype=np.float32)
    return Image.fromarray(out.clip(0, 255).astype(np.uint8))


def plant(image: Image.Image, kind: str, rng: random.Random) -> bytes:
    """A near copy of ``image``: re-encoded at low quality, resized, cropped or brightened."""
    if kind == "resize":
        scale = rng.uniform(0.8, 0.95)
        image = image.resize((round(image.width * scale), round(image.height * scale)), Image.Resampling.BILINEAR)
    elif kind == "crop":
        dx, dy = round(image.width * 0.03), round(image.height * 0.03)
        image = image.crop((dx, dy, image.width - dx, image.height - dy))
    elif kind == "bright":
        image = ImageEnhance.Brightness(image).enhance(1.08)
    return jpeg_bytes(image, quality=45 if kind == "quality" else 85)


KINDS = ("quality", "resize", "crop", "bright")


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """DISTINCT photos in two classes and one near copy of every third one (named z_..., so it
    comes after its original in source order); returns the folder and {copy key: original key}."""
    root = tmp_path_factory.mktemp("planted")
    (root / "c1").mkdir()
    copies = {}
    rng = random.Random(0)
    for i in range(DISTINCT):
        image = texture(i)
        path = root / f"c{i % 2}" / f"p{i:03d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(jpeg_bytes(image))
        if i % 3 == 0:
            kind = KINDS[(i // 3) % len(KINDS)]
            (root / "c1" / f"z_{kind}_{i:03d}.jpg").write_bytes(plant(image, kind, rng))
            copies[f"c1/z_{kind}_{i:03d}"] = f"c{i % 2}/p{i:03d}"
    return root, copies


def report_lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "duplicates.jsonl").read_text().splitlines()]


def test_planted_copies_dropped_distinct_kept(planted: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    src, copies = planted
    index = convert(str(src), str(tmp_path / "out"), ConvertOptions(source="imagefolder", near_threshold=10)).index
    assert index.duplicates == len(copies) and index.num_samples == DISTINCT
    lines = report_lines(tmp_path / "out")
    assert {line["key"]: line["duplicate_of"] for line in lines} == copies
    assert all(0 <= line["distance"] <= 10 and line["where"].endswith(f"{line['key']}.jpg") for line in lines)
    assert index.conversion["near_threshold"] == 10 and index.conversion["dedupe"] is False


def test_decoded_hdf5_keeps_the_same_survivors(planted: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    """--dedupe near into decoded HDF5: the survivors of the JPEG conversion, as pixels of the
    first kept sample's shape."""
    import fastload
    from fastload.formats.writing import WriterOptions

    src, copies = planted
    jpeg = convert(str(src), str(tmp_path / "jpeg"), ConvertOptions(source="imagefolder", near_threshold=10)).index
    options = ConvertOptions(source="imagefolder", layout="hdf5", near_threshold=10, writer_options=WriterOptions(hdf5_decoded=True))
    pixels = convert(str(src), str(tmp_path / "pixels"), options).index
    assert pixels.decoded_shape == (300, 400, 3) and pixels.duplicates == jpeg.duplicates == len(copies)
    assert report_lines(tmp_path / "pixels") == report_lines(tmp_path / "jpeg")
    keys = [fastload.open(tmp_path / name).raw(i)[0] for name in ("jpeg", "pixels") for i in range(DISTINCT)]
    assert keys[:DISTINCT] == keys[DISTINCT:]


def test_threshold_zero_keeps_the_changed_copies(planted: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    """At 0 bits only identical signatures are duplicates: the resized/cropped copies survive."""
    src, copies = planted
    index = convert(str(src), str(tmp_path / "out"), ConvertOptions(source="imagefolder", near_threshold=0)).index
    assert index.duplicates < len(copies) - 1
    lines = report_lines(tmp_path / "out") if index.duplicates else []
    assert all(line["distance"] == 0 for line in lines)


def test_same_survivors_and_bytes_for_any_workers(planted: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    src, _ = planted
    common = ["convert", str(src), "--from", "imagefolder", "--dedupe", "near", "--shuffle", "--seed", "5", "--samples-per-shard", "7", "--quiet"]
    run_cli(*common[:2], str(tmp_path / "one"), *common[2:], "--workers", "1")
    run_cli(*common[:2], str(tmp_path / "two"), *common[2:], "--workers", "2")
    one, two = tree_bytes(tmp_path / "one"), tree_bytes(tmp_path / "two")
    assert "duplicates.jsonl" in one and one == two


def test_report_png_has_one_row_per_group(planted: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    src, copies = planted
    report = tmp_path / "dups.png"
    run_cli("convert", str(src), str(tmp_path / "out"), "--from", "imagefolder", "--dedupe", "near", "--report", str(report), "--quiet")
    with Image.open(report) as image:
        image.verify()
    with Image.open(report) as image:
        assert image.format == "PNG" and int(image.text[GROUPS_CHUNK]) == len(set(copies.values()))


def test_report_html_is_one_self_contained_page_of_the_groups(planted: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    """--report x.html: a row per group, every thumbnail inline as a data: JPEG that decodes,
    each captioned with its key (kept first, then its copies)."""
    import base64
    import io
    from html.parser import HTMLParser

    src, copies = planted
    report = tmp_path / "dups.html"
    run_cli("convert", str(src), str(tmp_path / "out"), "--from", "imagefolder", "--dedupe", "near", "--report", str(report), "--quiet")

    class Page(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.meta: dict[str, str] = {}
            self.rows: list[list[str]] = []  # each group's image alts, in order
            self.sources: list[str] = []

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            a = {k: v or "" for k, v in attrs}
            if tag == "meta" and "name" in a:
                self.meta[a["name"]] = a["content"]
            elif tag == "div" and a.get("class") == "group":
                self.rows.append([])
            elif tag == "img":
                self.rows[-1].append(a["alt"])
                self.sources.append(a["src"])

    page = Page()
    page.feed(report.read_text(encoding="utf-8"))
    groups = {original: sorted(c for c, o in copies.items() if o == original) for original in set(copies.values())}
    assert int(page.meta[GROUPS_CHUNK]) == len(groups) == len(page.rows)
    assert sorted((row[0], sorted(row[1:])) for row in page.rows) == sorted(groups.items())
    for source in page.sources:
        assert source.startswith("data:image/jpeg;base64,")
        with Image.open(io.BytesIO(base64.b64decode(source.split(",", 1)[1]))) as thumb:
            assert thumb.format == "JPEG" and max(thumb.size) <= 112


def test_undecodable_image_reported_and_rest_deduplicated(planted: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    import shutil

    src, copies = planted
    shutil.copytree(src, tmp_path / "src")
    good = (src / "c0" / "p000.jpg").read_bytes()
    (tmp_path / "src" / "c0" / "broken.jpg").write_bytes(good[: len(good) // 2])
    index = convert(str(tmp_path / "src"), str(tmp_path / "out"), ConvertOptions(source="imagefolder", near_threshold=10, on_error="skip")).index
    assert index.duplicates == len(copies) and sum(index.skipped.values()) == 1
    skipped = [json.loads(line) for line in (tmp_path / "out" / "skipped.jsonl").read_text().splitlines()]
    assert [entry["key"] for entry in skipped] == ["c0/broken"]


def test_overlap_finds_b_near_a_and_writes_the_exclude_file(planted: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    """A: the distinct photos; B (HDF5): the planted copies and new photos: exactly the copies overlap."""
    src, copies = planted
    a_src, b_src = tmp_path / "a_src", tmp_path / "b_src"
    for path in src.rglob("p*.jpg"):
        (a_src / path.parent.name).mkdir(parents=True, exist_ok=True)
        (a_src / path.parent.name / path.name).write_bytes(path.read_bytes())
    (b_src / "c1").mkdir(parents=True)
    for path in src.rglob("z_*.jpg"):
        (b_src / "c1" / path.name).write_bytes(path.read_bytes())
    for i in range(100, 108):
        (b_src / "c1" / f"new{i}.jpg").write_bytes(jpeg_bytes(texture(i)))
    run_cli("convert", str(a_src), str(tmp_path / "a"), "--from", "imagefolder", "--quiet")
    run_cli("convert", str(b_src), str(tmp_path / "b"), "--from", "imagefolder", "--to", "hdf5", "--quiet")
    exclude, report = tmp_path / "exclude.txt", tmp_path / "overlap.png"
    result = run_cli("overlap", str(tmp_path / "a"), str(tmp_path / "b"), "--json", "--workers", "2",
                     "--write-exclude", str(exclude), "--report", str(report))
    found = json.loads(result.stdout)
    assert found["a_samples"] == DISTINCT and found["b_samples"] == len(copies) + 8
    assert {m["b_key"]: m["a_key"] for m in found["matches"]} == copies
    assert exclude.read_text(encoding="utf-8").splitlines() == sorted(copies)
    with Image.open(report) as image:
        assert int(image.text[GROUPS_CHUNK]) == len(copies)


def test_overlap_reads_a_dataset_served_over_http(planted: tuple[Path, dict[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A given by URL (a real HTTP server on loopback serving the converted folder): the same
    matches as A read from disk, each of A's shards fetched once."""
    import functools
    import threading
    from collections import Counter
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    src, copies = planted
    a_src, b_src = tmp_path / "a_src" / "c0", tmp_path / "b_src" / "c1"
    a_src.mkdir(parents=True)
    b_src.mkdir(parents=True)
    for path in src.rglob("p*.jpg"):
        (a_src / f"{path.parent.name}_{path.name}").write_bytes(path.read_bytes())
    for path in src.rglob("z_*.jpg"):
        (b_src / path.name).write_bytes(path.read_bytes())
    run_cli("convert", str(a_src.parent), str(tmp_path / "a"), "--from", "imagefolder", "--samples-per-shard", "8", "--quiet")
    run_cli("convert", str(b_src.parent), str(tmp_path / "b"), "--from", "imagefolder", "--quiet")
    fetched: Counter[str] = Counter()

    class Handler(SimpleHTTPRequestHandler):
        def do_GET(self) -> None:
            fetched[self.path.lstrip("/")] += 1
            super().do_GET()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(tmp_path / "a")))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(tmp_path / "cache"))
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        remote = json.loads(run_cli("overlap", url, str(tmp_path / "b"), "--json", "--workers", "2").stdout)
    finally:
        server.shutdown()
        server.server_close()
    local = json.loads(run_cli("overlap", str(tmp_path / "a"), str(tmp_path / "b"), "--json", "--workers", "2").stdout)
    assert remote["matches"] == local["matches"] and remote["a_samples"] == DISTINCT
    assert {m["b_key"]: m["a_key"] for m in remote["matches"]} == {copy: "c0/" + original.replace("/", "_") for copy, original in copies.items()}
    tars = [name for name in fetched if name.endswith(".tar")]
    assert len(tars) == 4 and all(fetched[name] == 1 for name in tars), fetched


def test_inspect_shows_the_class_histogram_and_imbalance(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for name, count in (("cats", 6), ("dogs", 2), ("owls", 1)):
        (src / name).mkdir(parents=True)
        for i in range(count):
            (src / name / f"{i}.jpg").write_bytes(jpeg_bytes(texture(i, (40, 40))))
    run_cli("convert", str(src), str(tmp_path / "out"), "--from", "imagefolder", "--quiet")
    summary = json.loads(run_cli("inspect", str(tmp_path / "out"), "--json").stdout)
    balance = summary["class_balance"]
    shares = np.array([6, 2, 1]) / 9
    assert summary["class_counts"] == {"cats": 6, "dogs": 2, "owls": 1}
    assert balance["max_min_ratio"] == 6 and balance["classes"] == 3
    assert balance["entropy_bits"] == pytest.approx(float(-(shares * np.log2(shares)).sum()))
    text = run_cli("inspect", str(tmp_path / "out")).stdout
    rows = [line.split() for line in text.splitlines() if line.startswith("  ")]
    assert [(r[0], int(r[1]), len(r[2])) for r in rows] == [("cats", 6, 40), ("dogs", 2, 13), ("owls", 1, 7)]
    assert "largest/smallest 6.00" in text


@pytest.fixture(params=["c", "python"])
def index_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test with the C index (fastload/near/_index.c) and with the Python one."""
    if request.param == "python":
        monkeypatch.setattr(search, "native", None)
    elif search.native is None:
        pytest.skip("the near-duplicate index extension is not built")
    return request.param


@pytest.mark.parametrize("threshold,size", [(0, 100), (3, 100), (7, 10), (12, 100), (12, 200), (12, 10**4), (12, 10**6), (17, 1000), (24, 10**5)])
def test_multi_index_finds_the_closest_within_the_threshold(threshold: int, size: int, index_backend: str) -> None:
    """Against brute force over signatures planted at the threshold, one bit past it and at
    random distances, some with colours off by one past the tolerance, whatever bands ``size``
    chooses: the closest within the threshold whose colours match, ties to the smaller ident."""
    check_closest_against_brute_force(threshold, size)


def check_closest_against_brute_force(threshold: int, size: int) -> None:
    """Signatures added in a shuffled order under shuffled, partly negative idents: near copies
    of 60 random ones at the threshold (two: ties), one bit past it and at random distances, some
    with a colour byte just within or just past the tolerance; and queries whose one stored copy
    only one band can find where the threshold allows (the radius there, radius + 1 in every other
    band), each band in turn. Every query's answer is brute force's."""
    rng = random.Random(threshold * 1000 + size)
    colour = int.from_bytes(bytes(rng.randrange(20, 230) for _ in range(8)), "big")
    base = [rng.getrandbits(64) << 64 | colour for _ in range(60)]
    index = MultiIndex(threshold, size)

    def flipped(signature: int, bits: list[int]) -> int:
        return signature ^ sum(1 << 64 + bit for bit in bits)

    def near_copy(signature: int, distance: int) -> int:
        copy = flipped(signature, rng.sample(range(64), distance))
        if rng.random() < 0.3:  # one colour byte moved just within or just past the tolerance
            step = rng.choice([COLOUR_TOLERANCE, COLOUR_TOLERANCE + 1]) * rng.choice([-1, 1])
            copy += step << 8 * rng.randrange(8)
        return copy

    def found_by_one_band(signature: int, band: int) -> int:
        bits, budget = [], threshold
        for b, (shift, width) in sorted(enumerate(index.bands), key=lambda bw: bw[0] != band):  # the band first
            take = min(index.radius + (b != band), width, budget)
            bits += rng.sample(range(shift, shift + width), take)
            budget -= take
        return flipped(signature, bits)

    stored = base + [near_copy(b, d) for b in base for d in (threshold, threshold, threshold + 1, rng.randint(0, 30))]
    lonely = [rng.getrandbits(64) << 64 | colour for _ in range(3 * len(index.bands))]  # queries with one copy each
    stored += [found_by_one_band(q, n % len(index.bands)) for n, q in enumerate(lonely)]
    idents = rng.sample(range(-len(stored), len(stored)), len(stored))
    for position in rng.sample(range(len(stored)), len(stored)):
        index.add(stored[position], idents[position])
    for query in base + [near_copy(b, 1) for b in base] + lonely:
        within = sorted((hamming(query, s), ident) for ident, s in zip(idents, stored, strict=True) if hamming(query, s) <= threshold and colours_match(query, s))
        assert index.closest(query) == (within[0] if within else None)


@pytest.mark.skipif(search.native is None, reason="the near-duplicate index extension is not built")
def test_multi_index_without_the_popcount_instruction() -> None:
    """The C index's portable kernel (picked where the CPU lacks POPCNT; here forced with
    FASTLOAD_NO_POPCNT=1 in a new process) gives the same answers."""
    code = ("from fastload.near import search; assert search.native.kernel == 'plain', search.native.kernel\n"
            "from tests.near.test_near_dupes import check_closest_against_brute_force as c; c(12, 10**4); c(3, 100); c(12, 100)")
    subprocess.run([sys.executable, "-c", code], env={**os.environ, "FASTLOAD_NO_POPCNT": "1"}, check=True, cwd=Path(__file__).resolve().parents[2])


def test_first_occurrences_compares_with_the_kept_ones_only(index_backend: str) -> None:
    """a~b and b~c but a and c apart: b is dropped as a's duplicate, c is kept (not transitive)."""
    a = 0
    b = a ^ 0b111 << 64  # 3 hash bits from a
    c = b ^ 0b111 << 72  # 3 from b, 6 from a
    assert first_occurrences([a, None, b, c, a], 4) == [(2, 0, 3), (4, 0, 0)]


def test_same_structure_other_colour_is_not_a_duplicate(index_backend: str) -> None:
    """A pattern tinted red and the same pattern tinted blue hash alike (grey is a positive
    multiple of the pattern in both) but differ in colour: kept both. The red one darkened by 10%
    is a duplicate."""
    pattern = np.asarray(texture(3, (32, 32)).convert("L"), dtype=np.float32)
    def tinted(r: float, g: float, b: float) -> np.ndarray:
        return np.stack([pattern * r, pattern * g, pattern * b]).clip(0, 255).astype(np.uint8)
    red, blue, darker = signatures(np.stack([tinted(1.0, 0.5, 0.5), tinted(0.5, 0.5, 1.0), tinted(0.9, 0.45, 0.45)]))
    assert hamming(red, blue) <= 2 and not colours_match(red, blue)
    assert first_occurrences([red, blue, darker], 10) == [(2, 0, hamming(red, darker))]


def test_a_rerun_takes_the_signatures_an_interrupted_run_saved(tmp_path: Path) -> None:
    """A conversion stopped by a bad image leaves each signed run's signatures in its partial
    folder: the rerun (the image mended) keeps the shards written, rewrites nothing else and
    matches a fresh conversion; a saved signature is what the rerun decides by (one doctored
    to equal another's makes that photo a duplicate)."""
    from fastload.errors import SampleError

    src = tmp_path / "src" / "c0"
    src.mkdir(parents=True)
    for i in range(150):
        (src / f"p{i:03d}.jpg").write_bytes(jpeg_bytes(texture(100 + i, (60, 80))))
    good = (src / "p140.jpg").read_bytes()
    options = ConvertOptions(source="imagefolder", near_threshold=10, samples_per_shard=16)
    fresh = convert(str(tmp_path / "src"), str(tmp_path / "fresh"), options)
    assert fresh.index.duplicates == 0 and fresh.shards_written == 10
    outs = {name: tmp_path / name for name in ("resumed", "doctored")}
    (src / "p140.jpg").write_bytes(good[: len(good) // 3])  # truncated: the run stops when its shard gets to it
    for out in outs.values():
        with pytest.raises(SampleError, match="p140"):
            convert(str(tmp_path / "src"), str(out), options)
    (src / "p140.jpg").write_bytes(good)
    log = outs["doctored"] / ".fastload-partial" / "signatures.jsonl"
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted(entry["run"] for entry in entries) == [0, 1, 2]
    first = next(entry for entry in entries if entry["run"] == 0)
    first["signatures"][1] = first["signatures"][0]
    log.write_text("".join(json.dumps(entry) + "\n" for entry in entries))

    resumed = convert(str(tmp_path / "src"), str(outs["resumed"]), options)
    assert (resumed.shards_reused, resumed.shards_written) == (8, 2)
    assert tree_bytes(outs["resumed"]) == tree_bytes(tmp_path / "fresh")
    doctored = convert(str(tmp_path / "src"), str(outs["doctored"]), options)
    assert doctored.index.duplicates == 1 and doctored.shards_reused == 0
    assert report_lines(outs["doctored"]) == [{"key": "c0/p001", "where": "c0/p001.jpg", "duplicate_of": "c0/p000", "distance": 0}]


def test_a_rerun_after_the_sources_changed_leaves_no_shard_of_the_old_plan(tmp_path: Path) -> None:
    """Stopped after 8 shards; then 36 photos become copies of another (dropped on the rerun),
    so the plan has 7 shards: the rerun writes what a fresh conversion writes, shard 7 gone."""
    from fastload.errors import SampleError

    src = tmp_path / "src" / "c0"
    src.mkdir(parents=True)
    for i in range(145):
        (src / f"p{i:03d}.jpg").write_bytes(jpeg_bytes(texture(300 + i, (60, 80))))
    good = (src / "p140.jpg").read_bytes()
    (src / "p140.jpg").write_bytes(good[: len(good) // 3])
    options = ConvertOptions(source="imagefolder", near_threshold=10, samples_per_shard=16)
    with pytest.raises(SampleError, match="p140"):
        convert(str(tmp_path / "src"), str(tmp_path / "out"), options)
    assert (tmp_path / "out" / "shard-00007.tar").is_file()
    (src / "p140.jpg").write_bytes(good)
    for i in range(10, 46):
        (src / f"p{i:03d}.jpg").write_bytes((src / "p000.jpg").read_bytes())
    rerun = convert(str(tmp_path / "src"), str(tmp_path / "out"), options)
    assert rerun.index.duplicates == 36 and len(rerun.index.shards) == 7
    convert(str(tmp_path / "src"), str(tmp_path / "fresh"), options)
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "fresh")


@pytest.mark.parametrize("dedupe", ["exact", "near"])
def test_a_report_of_grey_pixels_from_an_npz(tmp_path: Path, dedupe: str) -> None:
    """An npz of grey images gives H x W x 1 pixels: the report draws them (Pillow refused that shape)."""
    images = np.random.default_rng(0).integers(0, 255, (6, 28, 28), dtype=np.uint8)
    images[4] = images[1]  # one exact copy: a group for either kind of dedupe
    np.savez(tmp_path / "grey.npz", images=images, labels=np.arange(6))
    report = tmp_path / "dups.png"
    run_cli("convert", str(tmp_path / "grey.npz"), str(tmp_path / "out"), "--from", "npz", "--dedupe", dedupe,
            "--report", str(report), "--quiet")
    with Image.open(report) as image:
        assert image.format == "PNG" and int(image.text[GROUPS_CHUNK]) == 1


ODD_KEYS = ["line\nbreak", "cr\rlf", '"quoted"', "sep\u2028arated", "group\x1dsep", "next\x85line", " padded "]


def test_the_exclude_file_round_trips_keys_holding_line_breaks_and_quotes(tmp_path: Path) -> None:
    """B (HDF5, whose key column holds any string) has keys a plain line cannot hold; the ones
    `fastload overlap --write-exclude` writes, the loader's exclude= reads back exactly."""
    photos = [jpeg_bytes(texture(i)) for i in range(len(ODD_KEYS) + 2)]
    (tmp_path / "a_src" / "c").mkdir(parents=True)
    for i, photo in enumerate(photos[: len(ODD_KEYS)]):
        (tmp_path / "a_src" / "c" / f"p{i}.jpg").write_bytes(photo)
    run_cli("convert", str(tmp_path / "a_src"), str(tmp_path / "a"), "--from", "imagefolder", "--quiet")
    keys = [*ODD_KEYS, "plain", "other"]
    writer = open_writer("hdf5", tmp_path / "b" / "shard-00000.h5", WriterOptions())
    for key, photo in zip(keys, photos, strict=True):
        writer.add(PreparedSample(key=key, image_field="jpg", image=photo, label=0))
    (tmp_path / "b").mkdir(exist_ok=True)
    write_index(tmp_path / "b", DatasetIndex(layout="hdf5", shards=(writer.finish(),), fields=("cls", "jpg"), image_fields=("jpg",)))
    exclude = tmp_path / "exclude.txt"
    run_cli("overlap", str(tmp_path / "a"), str(tmp_path / "b"), "--write-exclude", str(exclude))
    assert read_exclude(exclude) == ODD_KEYS
    loader = fastload.DataLoader(str(tmp_path / "b"), batch_size=4, transform=T.val(16), exclude=exclude, return_keys=True)
    assert sorted(key for _, _, batch_keys in loader for key in batch_keys) == ["other", "plain"]


def test_a_key_list_round_trips_any_key_and_reads_plain_files_as_before() -> None:
    rng = np.random.default_rng(4)
    alphabet = ["a", "b", '"', "\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", " ", "\t", "é", "\\"]
    for _ in range(300):
        keys = ["".join(rng.choice(alphabet, size=int(rng.integers(1, 8)))) for _ in range(5)]
        keys = [key for key in keys if key.strip("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")] or ["k"]  # blank lines carry no key
        assert parse_keys(format_keys(keys), "f") == keys
    assert parse_keys("a b\n\nc\r\n  d\n", "f") == ["a b", "c", "  d"]  # hand-written: one key a line, blank lines ignored
    with pytest.raises(ValueError, match=r"^f: line 2 starts with a double quote but is not one JSON string"):
        parse_keys('a\n"b\n', "f")
