"""Images that lie or are damaged, through every decode path: a decompression bomb and an empty
frame are SampleErrors naming shard and key, never an allocation or a ZeroDivisionError; corrupt
JPEG data is an error, never silently changed pixels; a seeded fuzz of mutated JPEGs and PNGs
ends only in fastload errors. Anything that could allocate runs in a subprocess under RLIMIT_AS."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastload
from fastload import transforms as T
from fastload.decode.cpu import decode_image
from fastload.errors import SampleError
from fastload.storage.verify import verify_dataset
from tests.conftest import jpeg_bytes, png_bytes, small_photo
from tests.hostile_data import fake_png_header, mutate, run_limited, with_frame_size, write_raw_dataset

BAD = {"bomb": "decompression bomb", "pngbomb": "decompression bomb", "flat": "zero-sized", "narrow": "zero-sized"}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shard 0: six good JPEGs, then a 1 KB progressive JPEG claiming 65500x65500, a PNG claiming
    the same, and JPEGs whose frames claim a height or a width of zero; shard 1: eight good ones."""
    small = jpeg_bytes(small_photo(99, size=(16, 16)), progressive=True)
    samples = [(f"good{i}", "jpg", jpeg_bytes(small_photo(i)), i % 2) for i in range(6)]
    samples += [
        ("bomb", "jpg", with_frame_size(small, 65500, 65500), 0),
        ("pngbomb", "png", fake_png_header(65500, 65500), 0),
        ("flat", "jpg", with_frame_size(small, 16, 0), 0),
        ("narrow", "jpg", with_frame_size(small, 0, 16), 0),
    ]
    samples += [(f"more{i}", "jpg", jpeg_bytes(small_photo(10 + i)), 1) for i in range(6)]
    return write_raw_dataset(tmp_path_factory.mktemp("hostile"), samples, per_shard=10)


EVERY_PATH = """
import json, resource
from types import SimpleNamespace
import fastload
from fastload import transforms as T
from fastload.backends.dali.feed import DaliFeed
from fastload.backends.dali.protocol import FeedColumns, carried_stacked, read_notes
from fastload.storage.verify import verify_dataset

root = {root!r}
out = {{}}

def failure(fn):
    try:
        fn()
    except fastload.FastloadError as exc:
        return [type(exc).__name__, getattr(exc, "where", ""), getattr(exc, "reason", str(exc))]
    except Exception as exc:
        return ["not a fastload error", type(exc).__name__, str(exc)[:200]]
    return None

ds = fastload.open(root)
out["getitem"] = {{ds.raw(i)[0]: failure(lambda: ds[i]) for i in range(len(ds))}}
for workers in (0, 1):
    def run(on_error):
        with fastload.DataLoader(root, batch_size=4, num_workers=workers, transform=T.train(32), on_error=on_error, max_skipped=None) as loader:
            batches = list(loader)
            return [len(b[0]) for b in batches], [[e["where"], e["reason"]] for e in loader.stats.skipped.entries]
    out[f"raise{{workers}}"] = failure(lambda: run("raise"))
    out[f"skip{{workers}}"] = run("skip")
out["verify"] = verify_dataset(root, decode=True).problems
loader = fastload.DataLoader(root, batch_size=16, num_workers=0, transform=T.val(32))
feed = DaliFeed(loader.dataset, loader.kind.sample_spec, carried_stacked(loader.kind.sample_spec, loader.kind.image_shape), tuple(T.val(32)), 0, "raise", len(loader.dataset), loader.kind.orders.spec(), 0)
notes = FeedColumns(*feed(SimpleNamespace(epoch_idx=0, iteration=0))[: len(FeedColumns._fields)]).notes
skipped, error = read_notes([bytes(n) for n in notes])
out["dali_plan"] = [error.where, error.reason] if error else None
feed_skip = DaliFeed(loader.dataset, loader.kind.sample_spec, carried_stacked(loader.kind.sample_spec, loader.kind.image_shape), tuple(T.val(32)), 0, "skip", len(loader.dataset), loader.kind.orders.spec(), 0)
out["dali_plan_skip"] = read_notes([bytes(n) for n in FeedColumns(*feed_skip(SimpleNamespace(epoch_idx=0, iteration=0))[: len(FeedColumns._fields)]).notes])[0]
out["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def test_bombs_and_empty_frames_are_sample_errors_on_every_decode_path(hostile: Path) -> None:
    out = run_limited(EVERY_PATH.format(root=str(hostile)))
    for key, failure in out["getitem"].items():  # fastload.open(ds)[i]
        if key in BAD:
            assert failure[:2] == ["SampleError", f"shard-00000.tar:{key}"], failure
            assert BAD[key] in failure[2], failure
        else:
            assert failure is None, failure
    for workers in (0, 1):  # the loader, inline and in a worker process
        kind, where, reason = out[f"raise{workers}"]
        assert kind == "SampleError" and where.startswith("shard-00000.tar:") and BAD[where.split(":")[1]] in reason, out
        sizes, skipped = out[f"skip{workers}"]
        assert sizes == [4, 4, 4, 4] and {w for w, _ in skipped} == {f"shard-00000.tar:{k}" for k in BAD}  # a substitute may be counted twice
        assert all(BAD[w.split(":")[1]] in r for w, r in skipped)
    problems = out["verify"]  # fastload verify --decode
    assert len(problems) == len(BAD) and all(any(f":{k}: " in p and BAD[k] in p for p in problems) for k in BAD), problems
    where, reason = out["dali_plan"]  # the DALI backend's planning
    assert where.startswith("shard-00000.tar:") and BAD[where.split(":")[1]] in reason
    assert {w for w, _ in out["dali_plan_skip"]} == {f"shard-00000.tar:{k}" for k in BAD}
    assert out["max_rss_mb"] < 1500  # nothing was allocated for the claimed 4.3 G pixels


def test_one_limit_set_by_environment_bounds_loader_and_verify(hostile: Path) -> None:
    """FASTLOAD_MAX_PIXELS (read once by fastload.decode.header) is the limit of every reader."""
    script = f"""
    import json, fastload
    from fastload import transforms as T
    from fastload.storage.verify import verify_dataset
    def reason(fn):
        try:
            fn()
        except fastload.SampleError as exc:
            return exc.reason
    ds = fastload.open({str(hostile)!r})
    loader = fastload.DataLoader(ds, batch_size=4, num_workers=1, transform=T.val(16))
    problems = verify_dataset({str(hostile)!r}, decode=True).problems
    print(json.dumps([reason(lambda: ds[0]), reason(lambda: list(loader)), problems]))
    """
    getitem, loading, problems = run_limited(script, env={"FASTLOAD_MAX_PIXELS": "1000"})
    assert "decompression bomb: 64x48 = 3072 pixels > limit 1000" in getitem  # a 48x64 photo is over it
    assert "decompression bomb: 64x48 = 3072 pixels > limit 1000" in loading
    assert len(problems) == 16 and sum("limit 1000" in p for p in problems) == 14  # and the two empty frames


def test_decode_image_takes_the_converters_limit() -> None:
    data = jpeg_bytes(small_photo(1, size=(20, 30)))
    assert decode_image(data, "x", max_pixels=600).shape == (20, 30, 3)
    with pytest.raises(SampleError, match="decompression bomb: 30x20 = 600 pixels > limit 599"):
        decode_image(data, "x", max_pixels=599)
    with pytest.raises(SampleError, match="decompression bomb"):
        decode_image(png_bytes(small_photo(1, size=(20, 30))), "x", max_pixels=599)


def test_crop_decoder_checks_the_limit_against_libjpegs_own_reading() -> None:
    """Whatever fastload's header parser made of a file, the crop decoder refuses to allocate
    for an image over the limit as libjpeg reads it."""
    from fastload.decode.cpu import turbo as _turbo

    if _turbo is None:
        pytest.skip("the libjpeg-turbo extension is not built")
    data = jpeg_bytes(small_photo(1, size=(20, 30)))
    out = np.zeros((3, 8, 8), np.uint8)
    assert _turbo.decode_crop_into(data, (0.0, 0.0, 30.0, 20.0), out, 8, 8, False, 600) >= 1
    with pytest.raises(MemoryError, match="decompression bomb: 30x20 = 600 pixels > limit 599"):
        _turbo.decode_crop_into(data, (0.0, 0.0, 30.0, 20.0), out, 8, 8, False, 599)


def corrupt_jpeg(seed: int) -> bytes:
    """A JPEG whose scan data ends early (a cut in the middle): libjpeg warns, Pillow decodes it."""
    data = jpeg_bytes(small_photo(seed, size=(96, 128)))
    cut = len(data) // 2
    return data[:cut] + data[cut + 40 :]


def test_strict_decoding_rejects_what_pillow_accepts(tmp_path: Path) -> None:
    """fastload.open(ds)[i] and verify --decode decode whole images strictly: a libjpeg
    corrupt-data warning anywhere is an error (Pillow alone would return damaged pixels)."""
    bad = corrupt_jpeg(3)
    Image.open(io.BytesIO(bad)).load()  # Pillow: no error
    root = write_raw_dataset(tmp_path / "ds", [("good", "jpg", jpeg_bytes(small_photo(1)), 0), ("cut", "jpg", bad, 0)])
    with pytest.raises(SampleError, match="Corrupt JPEG data") as info:
        fastload.open(root)[1]
    assert info.value.where == "shard-00000.tar:cut"
    problems = verify_dataset(root, decode=True).problems
    assert len(problems) == 1 and problems[0].startswith("shard-00000.tar:cut: ") and "Corrupt JPEG data" in problems[0]


@pytest.mark.parametrize("num_workers", [0, 1])
def test_corrupt_data_in_the_decoded_rows_is_an_error_or_a_counted_skip(tmp_path: Path, num_workers: int) -> None:
    """The crop decoder reads every row down to the crop's last one: a warning there raises."""
    samples = [(f"good{i}", "jpg", jpeg_bytes(small_photo(i, size=(96, 128))), 0) for i in range(3)]
    root = write_raw_dataset(tmp_path / "ds", [*samples, ("cut", "jpg", corrupt_jpeg(4), 0)])
    specs = [T.Resize((32, 32))]  # the whole image, down to its last row
    with fastload.DataLoader(root, batch_size=4, num_workers=num_workers, transform=specs) as loader:
        with pytest.raises(SampleError, match="corrupt JPEG") as info:
            list(loader)
    assert info.value.where == "shard-00000.tar:cut"
    with fastload.DataLoader(root, batch_size=2, num_workers=num_workers, transform=specs, on_error="skip") as loader:
        assert [len(b[0]) for b in loader] == [2, 2]
        assert [e["where"] for e in loader.stats.skipped.entries] == ["shard-00000.tar:cut"]


FUZZ = """
import json, time
import numpy as np
import fastload
from fastload import transforms as T

root, n = {root!r}, {n}
ds = fastload.open(root)
foreign = []  # (key, what) of every failure that is not a fastload error
errors = 0
start = time.monotonic()
for i in range(n):
    try:
        ds[i]
    except fastload.FastloadError:
        errors += 1
    except Exception as exc:
        foreign.append((ds.raw(i)[0], f"open(ds)[i]: {{type(exc).__name__}}: {{str(exc)[:100]}}"))
batches = {{}}
for name, specs in (("train", T.train(32)), ("val", T.val(32))):
    for on_error in ("skip", "raise"):
        try:
            with fastload.DataLoader(ds, batch_size=8, num_workers=0, transform=specs, on_error=on_error) as loader:
                batches[name + on_error] = sum(len(b[0]) for b in loader)
        except fastload.FastloadError:
            batches[name + on_error] = "error"
        except Exception as exc:
            foreign.append((name, f"DataLoader: {{type(exc).__name__}}: {{str(exc)[:100]}}"))
print(json.dumps({{"foreign": foreign, "errors": errors, "batches": batches, "seconds": time.monotonic() - start}}))
"""


def fuzz_samples(count: int, seed: int) -> list[tuple[str, str, bytes, int]]:
    """``count`` seeded mutations of baseline, progressive and grayscale JPEGs and of RGB, RGBA,
    grayscale and palette PNGs, damaged anywhere (header included) or only past the header."""
    rng = np.random.default_rng(seed)
    photo = small_photo(seed, size=(40, 56))
    originals = [
        ("jpg", jpeg_bytes(photo)), ("jpg", jpeg_bytes(photo, progressive=True)), ("jpg", jpeg_bytes(photo.convert("L"))),
        ("jpg", jpeg_bytes(photo, restart_marker_blocks=4)), ("png", png_bytes(photo)), ("png", png_bytes(photo.convert("RGBA"))),
        ("png", png_bytes(photo.convert("L"))), ("png", png_bytes(photo.convert("P"))),
    ]
    samples = []
    for i in range(count):
        ext, data = originals[i % len(originals)]
        samples.append((f"m{i:04d}", ext, mutate(data, rng, keep=2 if i % 2 else min(200, len(data) // 3)), 0))
    return samples


def test_fuzzed_images_end_only_in_fastload_errors(tmp_path: Path) -> None:
    """400 mutated JPEGs and PNGs, each through fastload.open(ds)[i] and all of them through the
    inline loader with train() and val(), raising and skipping: no crash (the subprocess would
    die), no hang (its timeout), no error that is not a FastloadError."""
    count = 400
    samples = fuzz_samples(count, seed=17)
    samples[::50] = [(f"ok{i}", "jpg", jpeg_bytes(small_photo(i, size=(40, 56))), 0) for i in range(len(samples[::50]))]
    root = write_raw_dataset(tmp_path / "fuzz", samples, per_shard=50)
    out = run_limited(FUZZ.format(root=str(root), n=count), timeout=90)
    assert out["foreign"] == [], json.dumps(out["foreign"][:10], indent=1)
    assert 0 < out["errors"] < count  # the mutations do break images, and not every one
    assert out["batches"]["trainraise"] == "error" and out["batches"]["valraise"] == "error"
