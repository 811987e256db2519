"""kafka-fetch-proxy: a protocol-level Kafka sidecar that reshapes Fetch traffic."""

__version__ = "0.1.0"
