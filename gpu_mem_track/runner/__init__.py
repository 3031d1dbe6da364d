"""The line runner: ``python -m gpu_mem_track run script.py`` records every line's memory.

Measuring: ``tracer`` (line events), ``samplers`` (memory readings), ``profiler`` (per-line
aggregation, with ``statements`` for multi-line statements), ``session`` (the run's stamp
listener and automatic censuses). Data: ``records``. Files and rendering: ``files``,
``render``. Entry: ``run`` (checks and reports), ``launch`` (the script as ``__main__``),
``cmdline`` (the command line split at the script).
Nothing in this package imports torch at module import: the script decides when torch and
CUDA start.
"""
