"""Near-duplicate images: perceptual signatures from a reduced decode, and the search between them."""
