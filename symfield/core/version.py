"""The package version (one place; read by the facade, cache keys and output records)."""
__version__ = "0.1.0"

# the packages whose versions every output file records (their distribution names)
PROVENANCE_PACKAGES = ("numpy", "sympy", "mpmath", "numba", "xarray")


def provenance() -> dict:
    """Where an output file came from: ``argv`` (sys.argv), ``time`` (UTC, ISO 8601) and the versions
    of symfield, Python and :data:`PROVENANCE_PACKAGES` (None when one is not installed). Read from
    the installed metadata, so it imports none of them (numba stays unloaded)."""
    import datetime
    import platform
    import sys
    from importlib import metadata

    def version(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None
    versions = {"symfield": __version__, "python": platform.python_version(),
                **{name: version(name) for name in PROVENANCE_PACKAGES}}
    return {"argv": [str(a) for a in sys.argv],
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "versions": versions}
