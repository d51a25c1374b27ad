"""ART's `art.tinker_native`: the native Tinker backend, not one here.

`TinkerNativeBackend` imports; using it raises `UnsupportedOptionError` saying what to use
(`art_core/_refused_art_names.py`).
"""

from art_core._refused_art_names import module_getattr

__all__: list[str] = []

__getattr__ = module_getattr("art.tinker_native", __name__)
