"""`hf-sentcl train RECIPE [--key value ...]` (also `python -m hf_sentcl.run`): train and evaluate as a recipe says."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from hf_sentcl.common import exits
from hf_sentcl.common.build_locks import guard_extension_builds
from hf_sentcl.common.distributed import finish_processes
from hf_sentcl.common.logs import hang_dump, setup_logging
from hf_sentcl.common.preemption import Preempted, stop_watching, stop_with_launcher, watch_signals
from hf_sentcl.modeling.health import TrainingFailure
from hf_sentcl.pipeline.stops import stop_if_signalled
from hf_sentcl.pipeline.train import run
from hf_sentcl.recipe.checks import checked
from hf_sentcl.recipe.parallelism import requests_deepspeed
from hf_sentcl.recipe.parser import RUN_PROG, Recipe, RecipeError, parse_recipe, recipe_usage
from hf_sentcl.recipe.parser import method_list as registered_methods
from hf_sentcl.recipe.run_folder import RunComplete
from hf_sentcl.recipe.run_lock import release_output_dirs

USAGE = f"usage: {recipe_usage()}"


def main(argv: Sequence[str] | None = None, prog: str = RUN_PROG) -> int:
    """Train as the recipe in `argv` says (`RECIPE [--key value ...]`), or print the help of `prog`, the command as
    the user called it (`python -m hf_sentcl.run`; `hf-sentcl train` answers its help without this module:
    `hf_sentcl.cli.print_recipe_help`); the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(f"usage: {recipe_usage(prog)}\n\n{method_list()}")
        return 2
    if "-h" in argv or "--help" in argv:
        return print_help([a for a in argv if a not in ("-h", "--help")], prog)
    with hang_dump():  # HF_SENTCL_HANG_DUMP_S=N: the stacks of a run still going after N s (benchmarks/gpu_check.py)
        return run_recipe(argv)


def run_recipe(argv: list[str]) -> int:
    """Parse the recipe, then check and run it with the preemption signals watched; the exit status."""
    stop_with_launcher()  # done by the entry points already; here too for callers of main()
    setup_logging()
    try:
        recipe = with_guarded_builds(parse_recipe(argv[0], argv[1:]))
    except (RecipeError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return exits.BAD_INPUT
    return watched_run(lambda: check_and_run(recipe), recipe.training.preemption_signals)


def check_and_run(recipe: Recipe) -> int:
    """Check the recipe (every process of a launch agrees on the outcome, `hf_sentcl.recipe.checks.checked`), stop
    if a preemption signal came meanwhile, then run it; the exit status."""
    try:
        plan = checked(recipe)
    except RunComplete as done:  # resume_from_checkpoint: auto, requeued after the run finished
        if done.failed:
            print(f"error: {done}", file=sys.stderr, flush=True)
            return exits.FAILED
        print(done, flush=True)
        return exits.OK
    except (RecipeError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return exits.BAD_INPUT
    stop_if_signalled(plan.recipe, "before training, while the recipe was read and checked")
    return results_status(run(plan))


def with_guarded_builds(recipe: Recipe) -> Recipe:
    """`recipe`, once a launch that asks for DeepSpeed (which builds C++ ops on first use) has its C++ extension
    build locks guarded (`hf_sentcl.common.build_locks`); RecipeError for a malformed setting of the guard."""
    if requests_deepspeed(recipe.training):
        try:
            guard_extension_builds()
        except ValueError as err:
            raise RecipeError(str(err)) from None
    return recipe


def results_status(results: dict) -> int:
    """A finished run's exit status: FAILED when its export or push failed (the message was printed)."""
    return exits.FAILED if {"push_error", "export_error"} & set(results.get("export", {})) else exits.OK


def watched_run(work: Callable[[], int], signals: Sequence[str] | None) -> int:
    """Run `work` (training; it returns the exit status) with the preemption `signals` watched
    (`hf_sentcl.common.preemption`): a training failure gives FAILED, a preemption PREEMPTED, each with its message,
    and every process of a launch ends together with one status (`finish_processes`)."""
    watch_signals(signals)
    try:
        status = work()
    except TrainingFailure as err:
        sys.stderr.write(f"error: {err}\n")  # one write: processes share stderr
        status = exits.FAILED
    except Preempted as stop:
        print(f"{stop}\nexit status {exits.PREEMPTED} (preempted)", file=sys.stderr, flush=True)
        status = exits.PREEMPTED
    except KeyboardInterrupt:  # a second Ctrl-C (the first checkpoints and stops: hf_sentcl.common.preemption)
        print(f"interrupted by a second Ctrl-C: stopped at once; the latest complete checkpoint is kept, the steps "
              f"after it are lost.\nexit status {exits.INTERRUPTED}", file=sys.stderr, flush=True)
        status = exits.INTERRUPTED
    finally:
        stop_watching()
        release_output_dirs()
    return finish_processes(status)


def method_list() -> str:
    """The registered methods, one line each (`hf_sentcl.recipe.parser.method_list`)."""
    return registered_methods()


def print_help(argv: list[str], prog: str = RUN_PROG) -> int:
    """`RECIPE --help` or `--method NAME --help`: every key of the method with type, default and help (keys the
    recipe sets also show its value); without a method, the usage and the methods. The exit status."""
    from hf_sentcl.cli import print_recipe_help

    return print_recipe_help(argv, prog)
