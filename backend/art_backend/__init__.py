"""art_backend: the serving and training backend (torch, transformers, peft).

Its public surface is its HTTP API and its four commands: `art-server` (`art_backend.cli`),
`art review` and `art diff` (`art_backend.review.cli`, `.diff_cli`) and `art replay`
(`art_backend.training.replay_cli`). Inside, five wings whose imports point one way
(serving and training stand side by side above the engines and the store):

    store/     the .art folder (checkpoints, history, trajectories, review decisions) and the
               completion records a train step reads (no torch)
    engines/   the Engine seam, the torch engine, vLLM in a child process, model and adapter
               loading, grammars, the model's tool-call dialect
    serving/   the OpenAI protocols (Chat Completions, Responses) over an engine
    training/  GRPO math, rows, the LoRA trainer, the training service and routes
    review/    the review web app and `art review` (no torch)
"""

__all__: list[str] = []
