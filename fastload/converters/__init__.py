"""Converters: raw datasets -> sharded WebDataset tar or HDF5 files with an index.json."""

from fastload.converters.conversion import ConvertReport, convert
from fastload.converters.convert_options import ConvertOptions, parse_size
from fastload.converters.sources import SourceOptions
from fastload.formats.writing import WriterOptions

__all__ = ["ConvertOptions", "ConvertReport", "SourceOptions", "WriterOptions", "convert", "parse_size"]
