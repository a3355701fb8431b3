"""Language-model data: tokenizers (identity and loading), packing documents into rows, and the
token orders (which documents and token spans a row of an epoch holds)."""
