"""Workloads that drive a node over real WebSockets, one module each."""
