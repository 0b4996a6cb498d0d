"""Launcher for the chat page (the Hugging Face Spaces convention: `python app.py`). The page itself is
rag_app.shells.page, installed with the package; `brain serve` starts the same page with flags.

Environment: BRAIN_HOME (the index), GRADIO_SERVER_NAME / GRADIO_SERVER_PORT (default 127.0.0.1:7860; any other
host needs BRAIN_UI_USER and BRAIN_UI_PASSWORD)."""

from __future__ import annotations

import os
import sys

from rag_app.engine import Brain, ConfigError
from rag_app.shells.page import serve


def main() -> int:
    host = os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1")
    try:
        port = int(os.environ.get("GRADIO_SERVER_PORT", "7860"))
        serve(Brain(), host, port)
    except (ConfigError, ValueError) as exc:
        print(f"brain: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
