"""The trio edges of the proxy: listeners, client connections, upstream links."""
