"""Run an ``agentmem serve`` app on a free local port in a thread, for tests that drive it over HTTP (the helper
benchmarks share: ``agentmem.testing.serving``)."""

from __future__ import annotations

from agentmem.testing.serving import free_port, running

__all__ = ["free_port", "running"]
