"""ART's `art.local`: `LocalBackend`, the backend in a child process on this machine."""

from art_core.local.backend import LocalBackend

__all__ = ["LocalBackend"]
