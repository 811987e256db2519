"""Benchmarks and measurements of the proxy (not tests: nothing here asserts speed).

``python -m bench.run`` measures the proxy's price side by side with direct connections
and haproxy (BENCHMARKS.md); the other modules are their own commands.
"""
