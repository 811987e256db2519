"""Sans-I/O relay logic: address rewriting, ApiVersions intersection, pipelining."""
