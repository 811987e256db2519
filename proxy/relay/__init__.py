"""Sans-I/O relay logic: the per-connection relay (``relay``), address rewriting, ApiVersions."""
