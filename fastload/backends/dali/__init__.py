"""The DALI backend's protocol: ``feed`` (a picklable external source handing DALI each batch's
encoded bytes and crop plans in fastload's order), ``pipeline`` (the DALI pipeline decoding them),
``protocol`` (the named columns between the two) and ``library`` (the only module importing
``nvidia.dali``, lazily)."""
