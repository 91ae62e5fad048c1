"""Spark runtime of the framework: the only package that imports pyspark."""

from framework.spark._metrics import BatchMetrics
from framework.spark._two_phase import TwoPhaseSink

__all__ = ["BatchMetrics", "TwoPhaseSink"]
