import sys

from proxy.cli import main

sys.exit(main())
