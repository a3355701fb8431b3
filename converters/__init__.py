"""Converters: raw datasets -> sharded WebDataset tar or HDF5 files with an index.json."""

from converters.options import ConvertOptions, parse_size
from converters.run import ConvertReport, convert
from converters.sources import SourceOptions
from converters.writers import WriterOptions

__all__ = ["ConvertOptions", "ConvertReport", "SourceOptions", "WriterOptions", "convert", "parse_size"]
