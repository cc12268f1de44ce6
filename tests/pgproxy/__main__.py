"""``python -m tests.pgproxy --listen HOST:PORT --upstream HOST:PORT --control PATH``."""

from __future__ import annotations

from .control import main

main()
