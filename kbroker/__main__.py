"""``python -m kbroker ...`` is the ``kbroker`` command (cluster up starts brokers this way)."""
import sys

from kbroker.cli.main import main

sys.exit(main())
