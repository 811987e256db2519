import sys

from devbroker.cli import main

sys.exit(main())
