"""art_langgraph: train an existing LangChain / LangGraph agent by swapping its chat model.

    import art_langgraph
    async with art_langgraph.rollout(model, scenario=task) as r:
        llm = art_langgraph.init_chat_model()          # or TrainableChatModel(model)
        result = await graph.ainvoke(...)              # a graph built on `llm`
        r.reward = score(result)
    r.trajectory                                       # every call, exact tokens

Or change nothing but the URL: a stock `ChatOpenAI(base_url=r.base_url, api_key=r.api_key,
model=r.model)` inside `async with model.rollout() as r:` is recorded by the server too.
"""

from art_langgraph._chat_model import ModelNameMismatchError, TrainableChatModel, init_chat_model
from art_langgraph._scope import NoRolloutError, current_rollout, rollout, wrap_rollout

__all__ = [
    "ModelNameMismatchError",
    "NoRolloutError",
    "TrainableChatModel",
    "current_rollout",
    "init_chat_model",
    "rollout",
    "wrap_rollout",
]
