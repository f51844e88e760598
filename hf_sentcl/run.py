"""`python -m hf_sentcl.run RECIPE [--key value ...]` and `accelerate launch -m hf_sentcl.run RECIPE`: train as a
recipe says. The same command as `hf-sentcl train` (hf_sentcl.cli.train), kept under the name users launch."""

import sys

from hf_sentcl.common.preemption import watch_early

watch_early()  # a scheduler's signal during the seconds of imports below is noted, not fatal

from hf_sentcl.cli.train import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
