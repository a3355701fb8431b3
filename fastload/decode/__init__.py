"""Image decoders on the CPU: ``header`` (sizes without decoding), ``cpu`` (libjpeg-turbo through
fastload's own ``_turbo`` extension for crops and simplejpeg for whole images, Pillow for the rest).
DALI's decoding is :mod:`fastload.backends.dali`."""
