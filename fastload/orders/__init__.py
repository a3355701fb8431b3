"""Sample orders as pure functions of (seed, epoch, position): global, streaming, class-balanced,
mixture; the seeded permutation they evaluate; the plain-value spec a worker recomputes them from."""
