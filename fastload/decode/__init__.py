"""Image decoders on the CPU: ``header`` (sizes without decoding), ``cpu`` (libjpeg-turbo through
``_turbo``/simplejpeg, Pillow for the rest). DALI's decoding is :mod:`fastload.dali`."""
