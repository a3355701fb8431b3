"""What every engine's epoch shares: options, the training position and its state_dict, the epoch
stage, torch's sampler surface, per-sample decoding, batch shaping, stats, prefetching, provenance."""
