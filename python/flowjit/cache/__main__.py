"""python -m flowjit.cache: the same as the flowjit-cache command."""
import sys

from .cli import main

sys.exit(main())
