"""Spark jobs around kafka-fetch-proxy: a Kafka data source that reads through the
proxy (``kafka-proxy``), and the fleet report over decision logs."""
