"""One module per command group of the ``rlvr`` command line (see ``rlvr/cli.py``)."""
