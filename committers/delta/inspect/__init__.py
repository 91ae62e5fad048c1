"""``python -m committers.delta``: the inspect, vacuum and remove-orphans commands, what they
gather from a table and how they render it. A top layer, beside ``format``: it may import
``framework`` and every other layer of the connector but ``format``; it imports no pyspark
itself."""
