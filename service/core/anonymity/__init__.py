"""k-anonymised releases: SaNGreeA and generalisation hierarchies."""
