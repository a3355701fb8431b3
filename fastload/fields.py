"""Sample fields, their roles and codecs: the one place that knows what ``jpg``, ``cls`` or
``npy`` mean (mosaic streaming's ``encodings.py`` idea: a codec per role, a role -> codec registry).

A sample is a key and named fields by extension, as in WebDataset. Each field has a **role**,
defaulted from its extension (the whole name, else its last dotted part: ``seg.png`` is an image
unless declared otherwise); ``mask`` and ``boxes`` are only ever declared. The loader asks this
module which fields to return and how; the workers ask it how to decode each one. Bad bytes are
a :class:`SampleError` naming the sample and the field, never the bytes.

Kept free of heavy imports (numpy, Pillow load lazily): the converters import it too.
"""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from fastload.errors import SampleError

if TYPE_CHECKING:
    import numpy as np

Role = Literal["image", "mask", "boxes", "label", "text", "json", "array", "video", "audio", "bytes"]
ROLES: tuple[str, ...] = ("image", "mask", "boxes", "label", "text", "json", "array", "video", "audio", "bytes")
GEOMETRIC_ROLES: tuple[str, ...] = ("image", "mask", "boxes")  # follow the primary image's crop, resize and flip
DECLARED_ROLES: tuple[str, ...] = ("mask", "boxes")  # never defaulted from an extension

IMAGE_FIELDS: tuple[str, ...] = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm", "pgm")
# the video containers fastload opens (fastload.av.pyav.DEMUXERS) by their files' extensions; an Ogg
# video file named .ogg is stored as ogv (an .ogg member of a tar is audio: AUDIO_FIELDS)
VIDEO_FIELDS: tuple[str, ...] = ("mp4", "webm", "mkv", "mov", "avi", "ogv", "m4v", "mpg", "mpeg", "mpv", "m1v", "m2v")
# recordings (fastload.av.pyav.AUDIO_DEMUXERS) by their files' extensions
AUDIO_FIELDS: tuple[str, ...] = ("flac", "wav", "mp3", "ogg", "oga", "opus", "m4a", "aac", "aiff", "aif", "weba")
# the roles whose samples are streams (fastload.media.MEDIA_ROLES) and their files' extensions; in
# fields=, a role's own name (``video``, ``audio``) takes a sample's stream of any of them
STREAM_FIELDS: dict[str, tuple[str, ...]] = {"video": VIDEO_FIELDS, "audio": AUDIO_FIELDS}
LABEL_FIELD = "cls"
JPEG_FIELD = "jpg"  # where a re-encoded image is stored
DECODED_FIELD = "pixels"  # HDF5 shards of decoded pixels: the image, already decoded
ARRAY_FIELD = "npy"
_DEFAULT_ROLES: dict[str, Role] = {
    **{ext: "image" for ext in IMAGE_FIELDS},
    **{ext: role for role, extensions in STREAM_FIELDS.items() for ext in extensions},  # type: ignore[misc]  # STREAM_FIELDS' keys are roles
    DECODED_FIELD: "image",
    LABEL_FIELD: "label",
    "txt": "text",
    "text": "text",
    "json": "json",
    ARRAY_FIELD: "array",
}
MAX_INT = 2**63 - 1  # labels fit an int64
# How deep a JSON field may nest (lists and objects): deeper values parse, but a worker cannot
# pickle them back (Python's recursion limit; ~600 levels already failed), and no metadata needs it.
MAX_JSON_DEPTH = 100
MAX_NPY_DIMS = 64  # numpy's own limit on an array's dimensions
_NPY_MAGIC = b"\x93NUMPY"


def default_role(name: str) -> Role:
    """The role a field has unless declared: from its whole name, else its last dotted part."""
    return _DEFAULT_ROLES.get(name) or _DEFAULT_ROLES.get(name.rsplit(".", 1)[-1], "bytes")


def is_field_member(name: str) -> bool:
    """Whether a tar member of this name is a sample's field, as webdataset groups them: it has a
    key and an extension (``KEY.EXT``, the key up to the first dot of its last part) and is
    neither hidden nor a ``__*__`` metadata file."""
    base = name.rsplit("/", 1)[-1]
    key, dot, ext = base.partition(".")
    return bool(dot and key and ext) and not (base.startswith("__") and key.endswith("__"))


def image_field(fields: Iterable[str]) -> str | None:
    """Which of a sample's fields holds its image (the first image extension present), if any."""
    present = set(fields)
    return next((f for f in IMAGE_FIELDS if f in present), None)


def has_images(fields: Iterable[str]) -> bool:
    """Whether any of these field names is an image by default."""
    return any(default_role(name) == "image" for name in fields)


def stream_fields(fields: Iterable[str]) -> list[str]:
    """Those of these field names that are videos or recordings by default (their stream facts go in the sample tables)."""
    return [name for name in fields if default_role(name) in STREAM_FIELDS]


def parse_label(data: bytes, where: str) -> int:
    """A ``cls`` field's label (decimal ASCII, as the writers store it); a SampleError naming
    ``where`` when it is not an integer in the int64 range."""
    try:
        label = int(data)
    except ValueError:
        raise SampleError(where, "cls is not an integer label") from None
    if not -MAX_INT - 1 <= label <= MAX_INT:
        raise SampleError(where, "cls is outside the int64 range")
    return label


def format_label(label: int) -> bytes:
    """How a label is stored as a ``cls`` field (decimal ASCII)."""
    return str(label).encode()


# --- codecs ------------------------------------------------------------------------------------


class Codec(Protocol):
    """Turns one field's stored bytes into its value; a SampleError naming ``where`` and ``field``."""

    def decode(self, data: bytes, where: str, field: str) -> Any: ...


class LabelCodec:
    """``cls``: a decimal integer label."""

    def decode(self, data: bytes, where: str, field: str) -> int:
        """The int label."""
        return parse_label(data, where)


class TextCodec:
    """``txt``: UTF-8 text, as a str."""

    def decode(self, data: bytes, where: str, field: str) -> str:
        """The text."""
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SampleError(where, f"field {field}: not UTF-8 text (at byte {exc.start})") from None


class JsonCodec:
    """``json``: parsed with the json module only (never anything that can run code), at most
    MAX_JSON_DEPTH levels deep."""

    def decode(self, data: bytes, where: str, field: str) -> Any:
        """The parsed value."""
        try:
            value = json.loads(data)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError names the line and column, not the text
            raise SampleError(where, f"field {field}: bad JSON ({type(exc).__name__}: {str(exc)[:80]})") from None
        if data.count(b"[") + data.count(b"{") > MAX_JSON_DEPTH and _nests_deeper(value, MAX_JSON_DEPTH):
            raise SampleError(where, f"field {field}: JSON nested deeper than {MAX_JSON_DEPTH} levels")
        return value


def _nests_deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` (parsed JSON) holds lists or objects more than ``limit`` levels deep;
    walked with a stack of its own (no recursion, whatever the depth)."""
    stack = [(value, 1)] if isinstance(value, (list, dict)) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (list, dict)))
    return False


class ArrayCodec:
    """``npy``: one NumPy array of any dtype but object (``allow_pickle=False``), read from its
    header, whose every claim is checked before the array is made (sides, item size, the bytes it
    promises against those the field holds): a header that lies is a SampleError, never numpy's
    ValueError (which ``on_error="skip"`` could not skip)."""

    def decode(self, data: bytes, where: str, field: str) -> np.ndarray:
        """The array (read-only: a view of the field's bytes)."""
        import numpy as np

        stream = io.BytesIO(data)
        try:
            version = np.lib.format.read_magic(stream)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read_header(stream)
        except Exception as exc:  # numpy's header reader raises many types for bad data (ValueError, SyntaxError, tokenize's TokenError, ...)
            raise SampleError(where, f"field {field}: not a .npy array ({type(exc).__name__})") from None
        if dtype.hasobject:
            raise SampleError(where, f"field {field}: a .npy of Python objects (needs pickle, which fastload never runs)")
        if dtype.itemsize == 0 or dtype.subdtype is not None:
            raise SampleError(where, f"field {field}: a .npy of zero-sized or sub-array items ({dtype.str}), which numpy.save never writes")
        if len(shape) > MAX_NPY_DIMS or any(side < 0 for side in shape):
            raise SampleError(where, f"field {field}: its .npy header gives a shape of negative sides or over {MAX_NPY_DIMS} of them")
        extent = dtype.itemsize  # what numpy checks: the sides but zeros, times the item size, must fit an index
        for side in shape:
            extent *= max(side, 1)
        if extent > MAX_INT:
            raise SampleError(where, f"field {field}: its .npy header gives a shape too big for any array")
        count = 1
        for side in shape:
            count *= side
        offset = stream.tell()
        if count * dtype.itemsize != len(data) - offset:
            raise SampleError(where, f"field {field}: its .npy header promises {count * dtype.itemsize} bytes, it holds {len(data) - offset}")
        array = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
        return array.reshape(shape[::-1]).T if fortran else array.reshape(shape)


class BoxesCodec:
    """Declared ``boxes``: K x 4 float boxes (x0, y0, x1, y1 in source pixels) from a ``.npy`` or a
    JSON list of 4-lists; float32, K may be 0."""

    def decode(self, data: bytes, where: str, field: str) -> np.ndarray:
        """The (K, 4) float32 boxes."""
        import numpy as np

        value = ArrayCodec().decode(data, where, field) if data.startswith(_NPY_MAGIC) else JsonCodec().decode(data, where, field)
        try:
            boxes = np.asarray(value, dtype=np.float32)
        except (TypeError, ValueError):
            raise SampleError(where, f"field {field}: boxes are not numbers") from None
        if boxes.size == 0:
            return np.zeros((0, 4), np.float32)
        if boxes.ndim != 2 or boxes.shape[1] != 4:
            raise SampleError(where, f"field {field}: boxes must be K x 4 (x0, y0, x1, y1), got shape {list(boxes.shape)}")
        if not np.isfinite(boxes).all():
            raise SampleError(where, f"field {field}: boxes hold NaN or infinity")
        return boxes


class ImageCodec:
    """An encoded image (jpg, png, webp, ...): HWC uint8 RGB, decoded whole (the workers decode
    only the crop instead: :mod:`fastload.workers.sample_decode`)."""

    def decode(self, data: bytes, where: str, field: str) -> np.ndarray:
        """The HWC uint8 pixels."""
        from fastload.decode.cpu import decode_image

        return decode_image(data, where)


class MaskCodec:
    """Declared ``mask``: an encoded single-channel image (PNG ``L``/``P``/``1``, or 16-bit grey)
    whose values are class ids: kept as they are (a palette image's indices, not its colours),
    HxW uint8, or uint16 for a 16-bit mask (instance ids)."""

    def decode(self, data: bytes, where: str, field: str) -> np.ndarray:
        """The HxW uint8 (uint16) class ids."""
        import numpy as np
        from PIL import Image

        from fastload.decode.header import image_size
        from fastload.decode.mask import WIDE_MODES

        image_size(data, where)  # the one pixel limit, from the header, before anything is decoded
        try:
            with Image.open(io.BytesIO(data)) as im:
                if im.mode in WIDE_MODES:
                    ids = np.asarray(im)
                    if ids.min(initial=0) < 0 or ids.max(initial=0) > 65535:
                        raise SampleError(where, f"field {field}: a mask's ids must fit 16 bits")
                    return ids.astype(np.uint16)
                if im.mode not in ("L", "P", "1"):
                    raise SampleError(
                        where, f"field {field}: a mask must be a single-channel image (L, P or 16-bit grey), this one is {im.mode}"
                    )
                return np.asarray(im, dtype=np.uint8)
        except SampleError:
            raise
        except Exception as exc:  # Pillow raises many types for bad data
            raise SampleError(where, f"field {field}: cannot decode mask: {type(exc).__name__}") from None


class VideoCodec:
    """A video file (mp4, webm, ...): its bytes; the workers decode only a clip's frames
    (:mod:`fastload.av.clip_decode`), planned from its stream facts in the sample table."""

    def decode(self, data: bytes, where: str, field: str) -> bytes:
        """The encoded video, as stored."""
        return data


class AudioCodec:
    """A recording (flac, wav, mp3, ...): its bytes; the workers decode only a crop's samples
    (:mod:`fastload.av.audio_decode`), planned from its stream facts in the sample table."""

    def decode(self, data: bytes, where: str, field: str) -> bytes:
        """The encoded recording, as stored."""
        return data


class BytesCodec:
    """Anything else: the stored bytes, untouched."""

    def decode(self, data: bytes, where: str, field: str) -> bytes:
        """The bytes."""
        return data


CODECS: dict[str, Codec] = {
    "image": ImageCodec(),
    "mask": MaskCodec(),
    "boxes": BoxesCodec(),
    "label": LabelCodec(),
    "text": TextCodec(),
    "json": JsonCodec(),
    "array": ArrayCodec(),
    "video": VideoCodec(),
    "audio": AudioCodec(),
    "bytes": BytesCodec(),
}


def decode_field(role: str, data: bytes, where: str, field: str) -> Any:
    """``data`` of field ``field`` decoded by its role's codec."""
    return CODECS[role].decode(data, where, field)


# --- which fields a loader returns ---------------------------------------------------------------


@dataclass(frozen=True)
class FieldSpec:
    """One requested field: its name (``jpg``, ``seg.png``; ``jpg;png`` takes the first present,
    as webdataset's ``to_tuple``; ``video``: a video of any container), its role, whether a
    sample may lack it (then a label is -1)."""

    name: str
    role: str
    optional: bool = False
    key: str = ""  # its name in the dict ``map=`` sees (default: ``name``)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", self.key or self.name)
        if not isinstance(self.name, str) or not self.name or any(not part for part in self.name.split(";")):
            raise ValueError(f"a field name must be a non-empty string such as 'jpg' or 'jpg;png', got {self.name!r}")
        if self.role not in ROLES:
            raise ValueError(f"field {self.name}: role must be one of {ROLES}, got {self.role!r}")
        if self.optional and self.role != "label":
            raise ValueError(f"field {self.name}: only a label may be optional")

    def find(self, present: Mapping[str, Any] | Iterable[str]) -> str | None:
        """The stored name this field takes in a sample with ``present`` fields, or None."""
        for name in self.alternatives:
            if name in present:
                return name
        return None

    @functools.cached_property
    def alternatives(self) -> tuple[str, ...]:
        """The stored names it may take, in order of preference (``video``: a stored field of that
        name, else any video container's)."""
        return tuple(dict.fromkeys(alt for part in self.name.split(";")
                                   for alt in ((part, *STREAM_FIELDS[part]) if part in STREAM_FIELDS else (part,))))

    @property
    def stacked(self) -> bool:
        """Whether values are batched in shared memory (fixed shape), else as a list."""
        return self.role in ("image", "mask", "label", "array") or self.role in STREAM_FIELDS


SampleMap = Callable[[dict, "np.random.Generator"], dict]


@dataclass(frozen=True)
class SampleSpec:
    """What the workers make of each sample, decided once by the loader: the requested fields in
    output order, the user's ``map`` and, for stacked arrays, their shape and dtype (from the
    dataset's first samples). ``classic``: today's batch layout, ``(images, labels)``."""

    fields: tuple[FieldSpec, ...]
    map: SampleMap | None = None
    classic: bool = False
    # media role -> what its fields' rows hold (fastload.media: video's Clip, audio's Audio; their sampling decided)
    media: Mapping[str, Any] = dataclass_field(default_factory=dict)
    array_shapes: tuple[tuple[str, tuple[int, ...], str], ...] = ()  # (field name, shape, dtype) of stacked arrays
    wide_masks: tuple[str, ...] = ()  # mask fields stacked as uint16 (16-bit masks among the first samples)

    def __post_init__(self) -> None:
        names = [f.name for f in self.fields]
        if not names:
            raise ValueError("fields= names no field")
        if len(set(names)) != len(names):
            raise ValueError(f"fields= names a field twice: {names}")
        if self.map is not None and not callable(self.map):
            raise TypeError(f"map= must be a callable (sample dict, numpy Generator) -> sample dict, got {type(self.map).__name__}")
        if any(f.role in DECLARED_ROLES for f in self.fields) and self.primary is None:
            raise ValueError("a mask or boxes field follows an image's crop: fields= must name an image field too")
        for role in STREAM_FIELDS:
            check_sampling(role, [f.name for f in self.fields if f.role == role], self.media.get(role))

    @functools.cached_property
    def primary(self) -> FieldSpec | None:
        """The first image field: its header plans the geometry of every geometric field."""
        return next((f for f in self.fields if f.role == "image"), None)

    @functools.cached_property
    def stored_names(self) -> frozenset[str]:
        """Every stored field name its fields may take: what a sample's read needs, no more."""
        return frozenset(name for f in self.fields for name in f.alternatives)

    def shape_of(self, name: str) -> tuple[tuple[int, ...], str] | None:
        """(shape, dtype) of stacked array field ``name``; None: it is ragged (a list)."""
        return next(((shape, dtype) for field, shape, dtype in self.array_shapes if field == name), None)

    def is_stacked(self, field: FieldSpec) -> bool:
        """Whether ``field``'s values go into the batch slots (arrays: when their shape is fixed)."""
        return field.stacked and (field.role != "array" or self.shape_of(field.name) is not None)


def check_sampling(role: str, names: Sequence[str], sampling: Any) -> None:
    """A ValueError unless media ``role``'s fields ``names`` (those asked for) and its ``sampling``
    (None: not given) come together: each needs the other (fastload.media's row says in what words)."""
    if bool(names) == (sampling is not None):
        return
    from fastload.media import MEDIA_ROLES

    option = MEDIA_ROLES[role].option
    if names:
        raise ValueError(f"field {names[0]} {option.asks}")
    raise ValueError(f"{option.keyword}= {option.offers}; the fields asked for hold none")


def classic_names(roles: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(image, label) stored names of the classic sample, each alternatives joined by ``;``: any
    image extension and ``cls``; of data read in place (``roles``: each column's), its first image
    column and its label column (``label``, else the first integer column)."""
    image, label = ";".join(IMAGE_FIELDS), LABEL_FIELD
    if roles:
        image = next((name for name, role in roles.items() if role == "image"), image)
        labels = [name for name, role in roles.items() if role == "label"]
        label = "label" if "label" in labels else labels[0] if labels else label
    return image, label


def classic_spec(decoded: bool, map: SampleMap | None = None, media: Mapping[str, Any] | None = None,
                 names: tuple[str, str] | None = None) -> SampleSpec:
    """Today's classification sample: the image (whatever its extension; with ``media``, one media
    role's sampling, that role's stream: ``video``) and an optional label, seen by ``map`` as
    ``image`` (``video``) and ``label``; ``names``: their stored names (:func:`classic_names`; a
    mixture's: each member's, as alternatives)."""
    image, label = names or classic_names()
    if media:
        role = next(iter(media))
        first = FieldSpec(role, role)
    else:
        first = FieldSpec(DECODED_FIELD if decoded else image, "image", key="image")
    return SampleSpec(fields=(first, FieldSpec(label, "label", optional=True, key="label")), map=map, classic=True, media=dict(media or {}))


def _requested_role(name: str) -> Role:
    """The role of a requested field not given one: its first alternative's default (``video``: video)."""
    first = name.split(";")[0]
    return first if first in STREAM_FIELDS else default_role(first)  # type: ignore[return-value]  # STREAM_FIELDS' keys are roles


def requested_spec(
    fields: Sequence[str] | Mapping[str, str] | None, dataset_fields: Sequence[str], decoded: bool,
    map: SampleMap | None = None, images: bool = False, media: Mapping[str, Any] | None = None,
    roles: Mapping[str, str] | None = None, classic: tuple[str, str] | None = None,
) -> SampleSpec:
    """The SampleSpec of a loader's ``fields=`` (a sequence of names, or a mapping name -> role),
    ``map=`` and ``media`` (each media role's sampling: ``clip=``, ``audio=``). Without ``fields=``:
    with a sampling of a role whose sample is not the classic one (audio), the stream (any
    extension) and, where the dataset has them, its label and transcript (``txt``); the classic
    layout when the dataset has images (or ``images``: the caller expects them) or, with a classic
    role's sampling (video's), that role's stream; else every field of the dataset in its index's
    order. ``roles``: the roles of data read in place, by column name (a field named without a role
    takes its column's); ``classic``: the classic sample's stored names where not those ``roles``
    give (a mixture's members')."""
    from fastload.media import MEDIA_ROLES

    roles, media = roles or {}, dict(media or {})
    if fields is None:
        for role, sampling in media.items():
            if not MEDIA_ROLES[role].classic:
                extra = [FieldSpec(LABEL_FIELD, "label", optional=True)] if LABEL_FIELD in dataset_fields else []
                extra += [FieldSpec("txt", "text")] if "txt" in dataset_fields else []
                return SampleSpec((FieldSpec(role, role), *extra), map=map, media={role: sampling})
        for role, row in MEDIA_ROLES.items():
            streams = [name for name in dataset_fields if default_role(name) == role]
            if row.classic and streams and (role in media or not (decoded or has_images(dataset_fields))):
                check_sampling(role, streams, media.get(role))
                return classic_spec(decoded, map, {role: media[role]})
            if row.classic and role in media:
                check_sampling(role, (), media[role])
        if images or decoded or has_images(dataset_fields) or "image" in roles.values():
            return classic_spec(decoded, map, names=classic or classic_names(roles))
        fields = list(dataset_fields)
    if isinstance(fields, str):
        raise TypeError(f"fields= takes a list of field names or a mapping name -> role, got the string {fields!r}")
    given = dict(fields) if isinstance(fields, Mapping) else {name: None for name in fields}
    specs = tuple(FieldSpec(name, role or roles.get(name) or _requested_role(name)) for name, role in given.items())
    return SampleSpec(specs, map=map, media=media)
