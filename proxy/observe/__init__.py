"""Observability: Prometheus metrics, the HTTP endpoint (/metrics, /healthz, /readyz,
/debug/sessions) and decision logs.  Only :mod:`.http` imports trio."""
