"""The life cycle of a stream: the one layer that calls several domains in order (stream
creation, the roll, expiry, the scheduler tick, the follow-ups a roll leaves to the worker).
Domains below it never import it or each other upward (docs/ARCHITECTURE.md, "Layers";
enforced by the import-linter contract in pyproject.toml)."""
