"""`python -m gateway` is the `dharma` command."""

import sys

from gateway.cli.main import main

sys.exit(main())
