"""art_backend: the serving and training backend (torch, transformers, peft).

Its public surface is its HTTP API and its two commands, `art-server` (`art_backend.cli`) and
`art review` (`art_backend.review.cli`). Inside, four wings whose imports point one way:

    store/     the .art folder: checkpoints, history, trajectories, review decisions (no torch)
    serving/   the engine seam and the torch engine, chat, constrained decoding, records
    training/  GRPO math, rows, the LoRA trainer, the training service and routes
    review/    the review web app and `art review` (no torch)
"""

__all__: list[str] = []
