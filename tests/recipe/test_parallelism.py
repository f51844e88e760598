"""Launch topology checks made before any work (issue 28): sharded configs the hardware cannot honour, methods that
cannot run sharded, DataParallel, process-group-only problems; DeepSpeed/FSDP checkpoint layouts on resume; modules
the training forward never reaches are frozen (DDP needs a gradient for every trainable weight)."""

from types import SimpleNamespace

import pytest
import torch

from hf_sentcl.modeling import SentenceEncoder
from hf_sentcl.modeling.health import CHECKPOINT_COMPLETE
from hf_sentcl.recipe import parallelism
from hf_sentcl.recipe.parallelism import (
    check_topology,
    data_parallel_problem,
    method_sharding_problem,
    process_group_problems,
    sharding_problem,
    zero3_init_problem,
)
from hf_sentcl.recipe.parser import RecipeError
from hf_sentcl.recipe.run_folder import missing_checkpoint_files

LAUNCH_ENV = ("ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED", "ACCELERATE_DEEPSPEED_ZERO_STAGE")


@pytest.fixture(autouse=True)
def no_launcher_env(monkeypatch):
    for name in LAUNCH_ENV:
        monkeypatch.delenv(name, raising=False)


def fake_recipe(method="simcse", world_size=1, eval_tasks=(), use_cpu=True, even_batches=True, peft=None,
                deepspeed_plugin=None, **training):
    args = SimpleNamespace(world_size=world_size, use_cpu=use_cpu, fsdp=None, deepspeed=None,
                           deepspeed_plugin=deepspeed_plugin,
                           accelerator_config=SimpleNamespace(even_batches=even_batches), **training)
    return SimpleNamespace(source="r.yaml", method=method, training=args, model=SimpleNamespace(peft=peft),
                           data=SimpleNamespace(eval_tasks=list(eval_tasks)))


def test_fsdp_without_accelerator_is_refused_naming_multi_cpu(monkeypatch):
    """Finding 0: accelerate runs FSDP configs as plain DDP on CPUs; the run says so and names the config."""
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    problem = sharding_problem(fake_recipe().training, accelerator=False)
    assert "multi_cpu.yaml" in problem and "FSDP" in problem
    assert sharding_problem(fake_recipe().training, accelerator=True) is None
    monkeypatch.setattr(parallelism, "has_accelerator", lambda: False)
    with pytest.raises(RecipeError, match="multi_cpu.yaml"):
        check_topology(fake_recipe())


@pytest.mark.parametrize("stage", ["2", "3"])
def test_deepspeed_without_accelerator_runs_but_method_refusals_hold(monkeypatch, stage):
    """DeepSpeed shards on CPU processes (its CPU accelerator; tests/pipeline/test_scaling.py trains ZeRO-2/3 there),
    so only the method's own refusals (ConSERT's classifier, LoRA under ZeRO-3) apply."""
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", stage)
    monkeypatch.setattr(parallelism, "has_accelerator", lambda: False)
    assert sharding_problem(fake_recipe().training, accelerator=False) is None
    check_topology(fake_recipe())
    consert = fake_recipe("consert", supervised_mode="joint")
    if stage == "3":
        with pytest.raises(RecipeError, match="r.yaml: method consert with supervised_mode 'joint' cannot run under "
                                              "DeepSpeed ZeRO-3"):
            check_topology(consert)
    else:
        check_topology(consert)


def test_no_sharding_requested_passes():
    assert sharding_problem(fake_recipe().training, accelerator=False) is None
    check_topology(fake_recipe())


@pytest.mark.parametrize("mode", ["sup", "joint", "joint-unsup", "sup-unsup"])
@pytest.mark.parametrize("env", [{"ACCELERATE_USE_FSDP": "true"},
                                 {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}])
def test_consert_supervised_modes_refuse_fsdp_and_zero3(monkeypatch, mode, env):
    """Finding 2: ConSERT's classifier weight is read outside the forward (ZeRO-3 would hand out an empty tensor)."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    problem = method_sharding_problem(fake_recipe("consert", supervised_mode=mode))
    assert problem is not None and "ddp" in problem and "deepspeed_zero2.yaml" in problem
    assert method_sharding_problem(fake_recipe("consert", supervised_mode="unsup")) is None


@pytest.mark.parametrize("env", [{"ACCELERATE_USE_FSDP": "true"},
                                 {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}])
def test_lora_refuses_fsdp_and_zero3(monkeypatch, env):
    """Finding 6: adapters would be merged into sharded weights and saved from process 0's shard."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    problem = method_sharding_problem(fake_recipe(peft={"r": 8}))
    assert problem is not None and "LoRA" in problem and "deepspeed_zero2.yaml" in problem
    assert method_sharding_problem(fake_recipe()) is None
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "false")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    assert method_sharding_problem(fake_recipe(peft={"r": 8})) is None


@pytest.mark.parametrize("env", [{"ACCELERATE_USE_FSDP": "true"},
                                 {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}])
def test_compiled_layers_refuse_fsdp_and_zero3(monkeypatch, env):
    """Their hooks gather each layer's weights around its forward, which a compiled layer graph does not go through."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(parallelism, "has_accelerator", lambda: True)
    with pytest.raises(RecipeError, match="r.yaml: compile_layers cannot run under .*compile_layers: false"):
        check_topology(fake_recipe(compile_layers=True))
    check_topology(fake_recipe(compile_layers=False))
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "false")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    check_topology(fake_recipe(compile_layers=True))


@pytest.mark.parametrize("method", ["self_guided", "clear"])
@pytest.mark.parametrize("env", [{"ACCELERATE_USE_FSDP": "true"},
                                 {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}])
def test_methods_using_weights_outside_the_forward_refuse_sharding_before_work(monkeypatch, method, env):
    """SG/SG-OPT and CLEAR run heads and regularizers outside the encoder's forward: refused by the recipe check (they
    used to be refused only once the model and data were loaded, when the trainer was built); ZeRO-2 runs them."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    problem = method_sharding_problem(fake_recipe(method))
    assert problem is not None and f"method {method} cannot run under" in problem
    assert "outside" in problem and "deepspeed_zero2.yaml" in problem
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "false")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    assert method_sharding_problem(fake_recipe(method)) is None


def test_zero3_init_flag_true_is_refused_naming_the_shipped_config():
    """A ZeRO-3 config with zero3_init_flag: true would build the encoder partitioned ('weight' must be 2-D in the
    before evaluation, ZeroDivisionError in the parameter count, one-dtype assertion with a head under bf16)."""
    assert zero3_init_problem(fake_recipe().training) is None
    assert zero3_init_problem(fake_recipe(deepspeed_plugin=SimpleNamespace(zero3_init_flag=False)).training) is None
    problem = zero3_init_problem(fake_recipe(deepspeed_plugin=SimpleNamespace(zero3_init_flag=True)).training)
    assert "zero3_init_flag: false" in problem and "deepspeed_zero3.yaml" in problem
    with pytest.raises(RecipeError, match="zero3_init_flag"):
        check_topology(fake_recipe(deepspeed_plugin=SimpleNamespace(zero3_init_flag=True)))


def test_the_recipe_check_runs_the_topology_check(monkeypatch, tmp_path, tiny_bert_dir, senteval_dir):
    """`checked` (what every run calls before loading anything) refuses a launch the topology check refuses: fsdp.yaml's
    environment on a machine without accelerators, here with a real parsed recipe, not a stand-in."""
    from hf_sentcl.recipe.checks import checked
    from hf_sentcl.recipe.parser import parse_recipe

    corpus = tmp_path / "train.txt"
    corpus.write_text("a sentence\nanother one\nand a third\n")
    recipe = parse_recipe(None, (), method="simcse", model_name_or_path=str(tiny_bert_dir), train_file=str(corpus),
                          sts_data_dir=str(senteval_dir), output_dir=str(tmp_path / "out"),
                          per_device_train_batch_size=2, use_cpu=True)
    monkeypatch.setattr(parallelism, "has_accelerator", lambda: False)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(RecipeError, match="asks for FSDP.*multi_cpu.yaml"):
        checked(recipe)
    assert not (tmp_path / "out").exists()  # refused before the run folder is made
    monkeypatch.delenv("ACCELERATE_USE_FSDP")
    checked(recipe)  # the same recipe passes without it


def test_consert_supervised_allows_zero2(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    assert method_sharding_problem(fake_recipe("consert", supervised_mode="joint")) is None


def test_several_gpus_in_one_process_are_refused(monkeypatch):
    """Finding 8: plain python on a multi-GPU host would train under DataParallel (decision faked on this CPU)."""
    one_process = fake_recipe(use_cpu=False)
    assert "ddp.yaml" in data_parallel_problem(one_process.training, 4)
    assert "CUDA_VISIBLE_DEVICES=0" in data_parallel_problem(one_process.training, 2)
    assert data_parallel_problem(one_process.training, 1) is None
    assert data_parallel_problem(fake_recipe(use_cpu=True).training, 4) is None  # use_cpu: no GPU used
    assert data_parallel_problem(fake_recipe(world_size=4, use_cpu=False).training, 4) is None  # launched: DDP
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    with pytest.raises(RecipeError, match="DataParallel"):
        check_topology(one_process)


def test_glue_and_uneven_batches_are_refused_in_a_process_group():
    """Findings 3 and 13: GLUE's nested Trainer hangs in a process group; the gather needs equal batches."""
    assert "hf-sentcl glue" in process_group_problems(fake_recipe(world_size=2, eval_tasks=["sts", "glue"]))[0]
    assert "even_batches" in process_group_problems(fake_recipe(world_size=2, even_batches=False))[0]
    assert process_group_problems(fake_recipe(world_size=1, eval_tasks=["glue"], even_batches=False)) == []
    with pytest.raises(RecipeError, match="eval_tasks"):
        check_topology(fake_recipe(world_size=2, eval_tasks=["glue"]))


def checkpoint_with(folder, files=(), folders=()):
    folder.mkdir()
    for name in (*files, CHECKPOINT_COMPLETE, "trainer_state.json", "rng_state_0.pth"):
        (folder / name).write_text("{}")
    for name in folders:
        (folder / name).mkdir()
        (folder / name / "state.pt").write_text("x")
    return folder


@pytest.mark.parametrize("layout", [
    dict(files=("optimizer.pt", "scheduler.pt", "model.safetensors")),  # DDP / one process
    dict(files=("scheduler.pt", "model.safetensors"), folders=("global_step4",)),  # DeepSpeed, 16-bit weights saved
    dict(folders=("global_step4",)),  # DeepSpeed ZeRO-3 without a gathered save: weights inside global_step4/
    dict(files=("optimizer.bin", "scheduler.pt", "pytorch_model_fsdp.bin")),  # FSDP full state dict
    dict(files=("scheduler.pt",), folders=("optimizer_0", "pytorch_model_fsdp_0")),  # FSDP sharded state dict
], ids=["ddp", "deepspeed", "deepspeed-no-16bit", "fsdp-full", "fsdp-sharded"])
def test_resume_accepts_every_trainer_checkpoint_layout(tmp_path, layout):
    """Finding 4: DeepSpeed writes global_stepN/, FSDP optimizer.bin or sharded folders; all are complete."""
    assert missing_checkpoint_files(checkpoint_with(tmp_path / "checkpoint-4", **layout)) == []


def test_resume_still_refuses_a_checkpoint_without_optimizer_state(tmp_path):
    missing = missing_checkpoint_files(checkpoint_with(tmp_path / "checkpoint-4",
                                                       files=("scheduler.pt", "model.safetensors")))
    assert len(missing) == 1 and missing[0].startswith("optimizer.pt")
    folder = checkpoint_with(tmp_path / "checkpoint-8", files=("optimizer.bin",), folders=("optimizer_0",))
    assert "scheduler.pt" in missing_checkpoint_files(folder)


@pytest.mark.parametrize("overrides, frozen", [
    (dict(), []),
    (dict(pooling_layer=1), ["layer 1"]),
    (dict(pooling_layer=0, pooling="mean"), ["layer 0", "layer 1"]),
    (dict(pooling_layer=-2), ["layer 1"]),
    (dict(pooling="cls_before_pooler", head="mlp"), ["head"]),
    (dict(pooling="first_last_avg", pooling_layer=1), []),
], ids=["default", "layer1", "layer0", "layer-2", "cls_before_pooler+mlp", "averaged"])
def test_modules_the_training_forward_never_reaches_are_frozen(tiny_bert_dir, overrides, frozen):
    """Finding 7: DDP (find_unused_parameters off) fails at step 2 on weights without gradient; they are frozen."""
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), **overrides)
    assert encoder.freeze_unreached() == frozen
    encoder.train()
    loss = encoder(input_ids=torch.tensor([[2, 7, 9, 3]])).embeddings.square().sum()
    loss.backward()
    without_grad = [n for n, p in encoder.named_parameters()
                    if p.requires_grad and p.grad is None and not n.startswith("backbone.pooler")]
    assert without_grad == []


#: the launch matrix's refused cells (tests/pipeline/test_launch_matrix.py launches one per sharded config)
MATRIX_REFUSALS = {
    "sg_opt_bert.yaml": "method self_guided cannot run under",
    "clear_bert.yaml": "method clear cannot run under",
    "consert_bert_joint.yaml": "method consert with supervised_mode 'joint' cannot run under",
    "consert_bert_sup_unsup.yaml": "method consert with supervised_mode 'sup-unsup' cannot run under",
    "esimcse_bert.yaml": "method esimcse cannot run under",
}


@pytest.mark.parametrize("recipe_name", sorted(MATRIX_REFUSALS))
@pytest.mark.parametrize("env", [{"ACCELERATE_USE_FSDP": "true"},
                                 {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}],
                         ids=["fsdp", "zero3"])
def test_shipped_recipes_the_matrix_refuses_are_refused_by_the_recipe_check(monkeypatch, recipe_name, env):
    """The shipped recipe itself, with what accelerate launch sets for fsdp.yaml / deepspeed_zero3.yaml, is refused
    naming the DDP and ZeRO-2 configs; under ZeRO-2 it passes."""
    from pathlib import Path

    from hf_sentcl.recipe.parser import parse_recipe

    recipe = parse_recipe(Path(__file__).resolve().parents[2] / "recipes" / recipe_name)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(parallelism, "has_accelerator", lambda: True)
    with pytest.raises(RecipeError, match=MATRIX_REFUSALS[recipe_name]) as refused:
        check_topology(recipe)
    assert "deepspeed_zero2.yaml" in str(refused.value) and recipe_name in str(refused.value)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "false")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    check_topology(recipe)
