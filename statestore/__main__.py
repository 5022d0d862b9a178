import sys

from statestore.cli.main import main

sys.exit(main())
