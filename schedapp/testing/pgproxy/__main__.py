"""``python -m schedapp.testing.pgproxy --listen HOST:PORT --upstream HOST:PORT --control PATH``.

Guarded, so that importing every module of the package (the wheel's smoke test) starts nothing.
"""

from __future__ import annotations

from .control import main

if __name__ == "__main__":
    main()
