"""The package's version, in one place: ``setup.cfg`` reads it, the reports and
``--version`` quote it."""

__version__ = "0.1.0"
