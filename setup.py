"""Build the optional libjpeg-turbo extension (fastload.decode._turbo); everything else is in
pyproject.toml. Without a compiler or libjpeg headers the build skips it, says so, and fastload
decodes through simplejpeg/Pillow instead (slower train-time crops, same results within rounding).
Wheels that carry their own libjpeg-turbo: scripts/build_wheel.sh, or cibuildwheel (README)."""

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import BaseError, CCompilerError, CompileError

NOTE = """
note: fastload's libjpeg-turbo extension (fastload.decode._turbo) was not built: it needs a C
compiler and the libjpeg-turbo headers (Debian/Ubuntu: apt-get install gcc libjpeg-dev; macOS:
brew install jpeg-turbo). fastload still works without it, decoding JPEG crops through the
slower simplejpeg/Pillow path; install those and reinstall fastload to get it.
"""


class BuildExtOrNote(build_ext):
    """build_ext that prints NOTE where the optional extension fails to compile or link."""

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except (CCompilerError, CompileError, BaseError):  # what setuptools skips an optional extension on
            print(NOTE, file=sys.stderr)
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
        )
    ],
)
