"""Observability: Prometheus metrics, the HTTP endpoint (/metrics, /healthz, /readyz,
/debug/sessions) and decision logs, fed from the Fetch path's effects (:mod:`.apply`).
Only :mod:`.http` imports trio."""
