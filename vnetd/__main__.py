import sys

from vnetd import gc_pause

gc_pause.pause()  # before the CLI's imports: vnetd.gc_pause

from vnetd.cli import main  # noqa: E402

sys.exit(main())
