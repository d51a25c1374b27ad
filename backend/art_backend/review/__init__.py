"""Review: the web app where a person flags runs or overrides rewards before the trainer learns
from them, and `art review`; torch-free."""
