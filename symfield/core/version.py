"""The package version (one place; read by the facade, cache keys and output records)."""
__version__ = "0.1.0"
