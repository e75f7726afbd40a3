import sys

from fovi_lab.cli import main

sys.exit(main())
