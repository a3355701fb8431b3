"""Image decoders: ``cpu`` (libjpeg-turbo through simplejpeg, Pillow for the rest) and ``dali``."""
