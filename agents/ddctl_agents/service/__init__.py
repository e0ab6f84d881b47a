"""The synchronizer as a network service: HTTP/2 app, runtime, durability."""
