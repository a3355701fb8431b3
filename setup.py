"""Build the optional libjpeg-turbo extension (fastload.decode._turbo); everything else is in
pyproject.toml. Without a compiler or libjpeg headers the build skips it and fastload decodes
through simplejpeg/Pillow instead (slower train-time crops, same results within rounding)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "fastload.decode._turbo",
            sources=["fastload/decode/_turbo.c"],
            libraries=["jpeg"],
            extra_compile_args=["-O3", "-std=c99"],
            optional=True,
        )
    ]
)
