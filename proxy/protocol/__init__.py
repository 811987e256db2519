"""Sans-I/O Kafka protocol layer shared by the proxy and the dev broker.

Nothing in this package imports trio or touches sockets: every function takes
bytes (or kio objects) and returns bytes (or kio objects).
"""
