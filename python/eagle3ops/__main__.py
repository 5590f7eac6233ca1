import sys

from eagle3ops.command import main

sys.exit(main())
