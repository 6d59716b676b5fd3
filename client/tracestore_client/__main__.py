"""`python -m tracestore_client ...` (see tracestore_client.cli)."""

import sys

from tracestore_client.cli import main

sys.exit(main())
