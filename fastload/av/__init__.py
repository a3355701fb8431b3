"""Video and audio: stream facts read once at conversion (:mod:`.facts`), clips and crops planned
from them without opening a file (:mod:`.clips`, :mod:`.crops`), decoded into a batch's rows in a
worker (:mod:`.clip_decode`, :mod:`.audio_decode`: the worker's random streams and stage clock are
passed in), each role's functions as fastload.media's registry calls them (:mod:`.video`,
:mod:`.audio`), and the FFmpeg binding that probes, decodes and re-encodes (:mod:`.pyav`, the one
module importing PyAV)."""
