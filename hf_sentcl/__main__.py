"""`python -m hf_sentcl COMMAND [...]`: the `hf-sentcl` command without the console script."""

import sys

from hf_sentcl.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m hf_sentcl"))
