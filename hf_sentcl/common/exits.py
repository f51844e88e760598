"""The exit statuses of `python -m hf_sentcl.run` (and of each process under `accelerate launch`), one place so that
the CLI, the docs' table (docs/reliability.md) and the tests agree."""

#: trained, evaluated and exported; or, with `resume_from_checkpoint: auto`, the run was already complete
OK = 0
#: training or publishing failed (a NaN loss, a collapsed model, a full disk, a push that failed after retries)
FAILED = 1
#: refused before any work: a bad recipe, data file or run folder (the message names the key, file or line)
BAD_INPUT = 2
#: stopped by a preemption signal after writing a complete checkpoint; rerun the same command to resume
#: (EX_TEMPFAIL of sysexits.h: "a temporary failure; the user is invited to retry")
PREEMPTED = 75
#: stopped at once by a second Ctrl-C (the shell's 128 + SIGINT); the latest complete checkpoint is kept
INTERRUPTED = 130
