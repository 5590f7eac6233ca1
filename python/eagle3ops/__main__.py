import sys

from eagle3ops.cli import main

sys.exit(main())
