"""Start-up phases on stderr: one `art-server: <phase>` line each, whatever the log level.

A start takes seconds to a minute (importing torch, converting a GGUF on its first use, loading
the weights); these lines say which part runs. `LocalBackend` shows them in the user's terminal
while it waits, since the server's own output goes to its log file.
"""

from __future__ import annotations

import sys

PREFIX = "art-server: "


def announce(phase: str) -> None:
    """Write `art-server: <phase>` to stderr at once."""
    print(f"{PREFIX}{phase}", file=sys.stderr, flush=True)
