"""``python -m gpu_mem_track``: see ``cli.py``."""

from .cli import main

raise SystemExit(main())
