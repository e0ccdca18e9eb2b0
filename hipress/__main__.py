from __future__ import annotations

import sys

from hipress.cli import main

sys.exit(main())
