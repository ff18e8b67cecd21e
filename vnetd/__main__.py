import sys

from vnetd.cli import main

sys.exit(main())
