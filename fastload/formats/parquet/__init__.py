"""Layout ``parquet``: Parquet files read where they are (a row group a shard, a row a sample)."""
