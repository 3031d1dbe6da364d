"""The VGG-19 demo that ``make demo`` runs: ``gpu_mem_track.examples.vgg_demo`` (an installed
package runs it as ``python -m gpu_mem_track.examples.vgg_demo``); same options.

    python scripts/tools/vgg_demo.py [--device cpu] [--image-size 224] [--batch 2]
"""

from __future__ import annotations

from gpu_mem_track.examples.vgg_demo import main

if __name__ == "__main__":
    raise SystemExit(main())
