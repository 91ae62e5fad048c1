"""Concrete destinations built on ``framework``: Delta Lake (exactly-once) and async sinks."""
