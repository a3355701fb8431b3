"""Build the optional C extensions: libjpeg-turbo crops (fastload.decode._turbo) and the
near-duplicate index (fastload.near._index); everything else is in pyproject.toml. Without a
compiler or libjpeg headers the build skips them, says so, and fastload decodes through
simplejpeg/Pillow (slower train-time crops, same results within rounding) and searches near
duplicates in Python (slower, the same answers).
Wheels that carry their own libjpeg-turbo: scripts/build_wheel.sh, or cibuildwheel (docs/wheels.md)."""

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import BaseError, CCompilerError, CompileError

NOTES = {
    "fastload.decode._turbo": """
note: fastload's libjpeg-turbo extension (fastload.decode._turbo) was not built: it needs a C
compiler and the libjpeg-turbo headers (Debian/Ubuntu: apt-get install gcc libjpeg-dev; macOS:
brew install jpeg-turbo). fastload still works without it, decoding JPEG crops through the
slower simplejpeg/Pillow path; install those and reinstall fastload to get it.
""",
    "fastload.near._index": """
note: fastload's near-duplicate index (fastload.near._index) was not built: it needs a C
compiler. `fastload convert --dedupe near` and `fastload overlap` still work, searching in
Python instead (190x slower at 100,000 images); install one and reinstall fastload to get it.
""",
}


class BuildExtOrNote(build_ext):
    """build_ext that prints the extension's note where an optional extension fails to compile or link."""

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except (CCompilerError, CompileError, BaseError):  # what setuptools skips an optional extension on
            print(NOTES[ext.name], file=sys.stderr)
            raise


setup(
    cmdclass={"build_ext": BuildExtOrNote},
    ext_modules=[
        Extension(
            "fastload.decode._turbo",
            sources=["fastload/decode/_turbo.c", "fastload/decode/_mask.c"],
            libraries=["jpeg"],
            extra_compile_args=["-O3", "-std=c99"],
            optional=True,
        ),
        Extension(
            "fastload.near._index",
            sources=["fastload/near/_index.c"],
            extra_compile_args=["-O3", "-std=c99"],
            optional=True,
        ),
    ],
)
