"""KIP-227 incremental fetch sessions (broker side in ``broker.py``)."""
