"""``python -m rlvr``: the command line, also as the entry point of ``torchrun ... -m rlvr train CONFIG``."""

import sys

from rlvr.cli import main

sys.exit(main())
