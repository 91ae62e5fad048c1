"""``python -m committers.delta``: the inspect, vacuum and remove-orphans commands, what they
gather from a table and how they render it. The top layer: it may import every other layer of
the connector and ``framework``; it does not import pyspark."""
