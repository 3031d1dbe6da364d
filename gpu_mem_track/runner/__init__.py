"""The line runner: ``python -m gpu_mem_track run script.py`` records every line's memory.

Measuring: ``tracer`` (line events), ``samplers`` (memory readings), ``profiler`` (per-line
aggregation, with ``statements`` for multi-line statements), ``session`` (the run's stamp
listener and automatic censuses). The folder it writes, its records and report are the
``runfolder`` package's. Entry: ``run`` (checks and reports), ``launch`` (the script as
``__main__``).
Nothing in this package imports torch at module import: the script decides when torch and
CUDA start.
"""
