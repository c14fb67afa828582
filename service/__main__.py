import sys

from glassbox.service.cli import main

sys.exit(main())
