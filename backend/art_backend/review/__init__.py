"""Review: the web app where a person flags runs or overrides rewards before the trainer learns
from them, and compares two steps' held-out answers; `art review` and `art diff`; torch-free."""
