"""The engines that make a loader's batches: ``cpu/`` (fastload's worker processes), ``dali/``
(NVIDIA DALI's pipeline, on a GPU or its CPU), ``hybrid/`` (each batch split between the two), and
the choice between them (``choice``)."""
