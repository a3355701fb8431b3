"""Small utilities every layer may use: files, sizes, ranks, extensions, forked pools."""
