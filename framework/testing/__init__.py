"""Conformance checks every exactly-once destination must pass (no pytest dependency)."""

from framework.testing._conformance import CONFORMANCE_CHECKS, ConformanceHarness

__all__ = ["CONFORMANCE_CHECKS", "ConformanceHarness"]
