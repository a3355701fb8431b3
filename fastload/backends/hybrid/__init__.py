"""The hybrid engine: each batch split between DALI and the CPU workers by their measured rates."""
