"""Count tables: the sketch, its cells in Redis's encoding, the count-period aggregate."""
