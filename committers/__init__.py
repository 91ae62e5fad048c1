"""Concrete destinations built on ``framework``: Delta Lake (exactly-once) and async sinks."""

from framework import __version__ as __version__
