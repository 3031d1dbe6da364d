"""What several scripts share: where the recorded fixtures are (``fixtures``) and a simulated
run of this checkout in a subprocess (``simulated``). A script puts ``scripts/`` on
``sys.path`` and imports ``_common.fixtures`` or ``_common.simulated``; nothing here imports
another script, so no script folder depends on another through it."""
