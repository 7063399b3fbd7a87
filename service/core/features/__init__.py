"""Count featurization: a stream's runtime, rows to keys and increments (counting), the per-epoch
featurizer and its columns, hot rows by column."""
