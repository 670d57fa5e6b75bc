"""The errors of the control-plane harness: a component did not build, start or answer."""

from __future__ import annotations


class ControlPlaneError(RuntimeError):
    """A component did not build, start or answer; the message names it (and its log tail)."""


class BinariesMissing(ControlPlaneError):
    """No built control plane for these pins; the message says where it was looked for and
    the command that builds it."""
