"""`python -m gateway` is the `dharma` command."""

import sys

from gateway.cli import main

sys.exit(main())
