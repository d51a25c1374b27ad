"""art_langgraph: LangGraph adapter (not yet built, see issue 5)."""
