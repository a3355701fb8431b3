"""Image decoders: ``cpu`` (libjpeg-turbo through fastload's own ``_turbo`` extension for crops and
simplejpeg for whole images, Pillow for the rest) and ``dali``."""
