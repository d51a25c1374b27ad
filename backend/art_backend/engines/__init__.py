"""The engines: the Engine seam and what sits behind it (torch, vLLM in a child process), loading
the base model and its adapters, grammars, and the model's chat and tool-call dialect."""
