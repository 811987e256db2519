"""Shared test helpers: a threaded dev-cluster runner and a record-batch builder."""
