"""ART's `art.tinker`: the backend on Tinker (Thinking Machines' training API), not one here.

`TinkerBackend`, `get_renderer_name` and `OpenAICompatibleTinkerServer` import; using one raises
`UnsupportedOptionError` saying what to use (`art_core/_refused_art_names.py`).
"""

from art_core._refused_art_names import module_getattr

__all__: list[str] = []

__getattr__ = module_getattr("art.tinker", __name__)
