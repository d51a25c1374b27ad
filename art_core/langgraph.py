"""ART's `art.langgraph`: the LangGraph integration, `art_langgraph` (the [langgraph] extra).

`from art_core.langgraph import init_chat_model, wrap_rollout` ports ART's line; each name is
art_langgraph's, imported on first use (a missing extra raises ImportError naming it).
"""

from art_core._refused_art_names import integration_getattr

__all__: list[str] = []  # art_langgraph's names: `art_langgraph.__all__`

__getattr__ = integration_getattr(__name__, "art_langgraph", "langgraph", {})
