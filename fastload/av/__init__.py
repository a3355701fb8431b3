"""Video: stream facts read once at conversion (:mod:`.facts`), clips planned from them without
opening a file (:mod:`.clips`), and the FFmpeg binding that probes, decodes and re-encodes
(:mod:`.pyav`, the one module importing PyAV)."""
