"""recipes/accelerate_configs/*.yaml: every config loads with accelerate's own config class, every nested key is one
`accelerate launch` knows (a misspelt key would be ignored silently), `accelerate launch` turns each into the
environment its plugins read, and the plugins accept it. Mixed precision from the launcher reaches the recipe."""

from pathlib import Path

import pytest
import yaml
from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import DeepSpeedPlugin, DistributedType, FullyShardedDataParallelPlugin
from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env, prepare_simple_launcher_cmd_env

from hf_sentcl.configs.arguments import per_device_batch_size
from hf_sentcl.configs.precision import LAUNCHER_PRECISION_ENV
from hf_sentcl.methods.simcse.config import SimCSEConfig
from hf_sentcl.recipe.checks import validate_recipe
from hf_sentcl.recipe.parser import RecipeError, parse_recipe

CONFIG_DIR = Path(__file__).resolve().parents[2] / "recipes" / "accelerate_configs"
CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))
EXPECTED = {  # file -> (distributed type, mixed precision)
    "single_gpu.yaml": (DistributedType.NO, "no"),
    "multi_cpu.yaml": (DistributedType.MULTI_GPU, "no"),
    "ddp.yaml": (DistributedType.MULTI_GPU, "no"),
    "ddp_fp16.yaml": (DistributedType.MULTI_GPU, "fp16"),
    "ddp_bf16.yaml": (DistributedType.MULTI_GPU, "bf16"),
    "deepspeed_zero2.yaml": (DistributedType.DEEPSPEED, "bf16"),
    "deepspeed_zero3.yaml": (DistributedType.DEEPSPEED, "bf16"),
    "fsdp.yaml": (DistributedType.FSDP, "bf16"),
}


def launch_env(path: Path) -> dict[str, str]:
    """The environment `accelerate launch --config_file PATH -m hf_sentcl.run recipe.yaml` gives its processes."""
    args = launch_command_parser().parse_args(["--config_file", str(path), "-m", "hf_sentcl.run", "recipe.yaml"])
    args, defaults, precision_from_config = _validate_launch_command(args)
    if args.use_deepspeed:  # as accelerate's launch_command does before calling the DeepSpeed launcher
        fields = list(defaults.deepspeed_config) + (["mixed_precision"] if precision_from_config else [])
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        return prepare_deepspeed_cmd_env(args)[1]
    if args.multi_gpu or args.use_fsdp:
        return prepare_multi_gpu_env(args)
    return prepare_simple_launcher_cmd_env(args)[1]


def test_the_documented_set_of_configs_exists():
    assert sorted(p.name for p in CONFIGS) == sorted(EXPECTED)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_loads_with_accelerate(path):
    """accelerate's ClusterConfig refuses unknown top-level keys; the type and precision are the documented ones."""
    config = load_config_from_file(str(path))
    assert isinstance(config, ClusterConfig)
    assert (config.distributed_type, config.mixed_precision) == EXPECTED[path.name]
    assert path.read_text().startswith("#")  # says what it is for and how to launch with it
    assert "accelerate launch --config_file recipes/accelerate_configs/" in path.read_text()


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_nested_keys_are_launch_arguments(path):
    """Keys under deepspeed_config / fsdp_config become `accelerate launch` arguments (fsdp_ prefixed); accelerate
    copies unknown ones without complaint, so they are checked against the launcher's parser here."""
    known = {action.dest for action in launch_command_parser()._actions}
    raw = yaml.safe_load(path.read_text())
    for section, prefix in (("deepspeed_config", ""), ("fsdp_config", "fsdp_")):
        for key in raw.get(section, {}):
            name = key if key.startswith(prefix) else prefix + key
            assert name in known, f"{path.name}: {section}.{key} is not an accelerate launch argument"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_launcher_exports_the_settings(path):
    env = launch_env(path)
    precision = EXPECTED[path.name][1]
    assert env["ACCELERATE_MIXED_PRECISION"] == precision
    if path.name.startswith("deepspeed"):
        assert env["ACCELERATE_USE_DEEPSPEED"] == "true"
        assert env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == path.stem[-1]
        # left to the recipe (DeepSpeed's "auto" filled from TrainingArguments)
        assert "ACCELERATE_GRADIENT_ACCUMULATION_STEPS" not in env and "ACCELERATE_GRADIENT_CLIPPING" not in env
        assert env["ACCELERATE_DEEPSPEED_ZERO3_INIT"] == "false"
    if path.name == "fsdp.yaml":
        assert (env["ACCELERATE_USE_FSDP"], env["FSDP_VERSION"], env["FSDP_AUTO_WRAP_POLICY"]) == (
            "true", "2", "TRANSFORMER_BASED_WRAP"
        )
        assert env["FSDP_STATE_DICT_TYPE"] == "FULL_STATE_DICT"


def test_fsdp_plugin_accepts_the_config(monkeypatch):
    """accelerate's FSDP plugin builds itself from the launcher's environment (FSDP2, transformer-layer wrapping)."""
    for key, value in launch_env(CONFIG_DIR / "fsdp.yaml").items():
        monkeypatch.setenv(key, value)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
    assert plugin.transformer_cls_names_to_wrap is None  # taken from the model's _no_split_modules (e.g. BertLayer)


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_plugin_accepts_the_config(monkeypatch, stage):
    """accelerate's DeepSpeed plugin (no deepspeed install needed to build it) reads the launcher's environment:
    the ZeRO stage, 16-bit gathering for saving under ZeRO-3, and accumulation/clipping left to the Trainer."""
    for key, value in launch_env(CONFIG_DIR / f"deepspeed_zero{stage}.yaml").items():
        monkeypatch.setenv(key, value)
    plugin = DeepSpeedPlugin()
    assert plugin.zero_stage == stage and plugin.zero3_init_flag is False
    config = plugin.deepspeed_config
    assert config["gradient_accumulation_steps"] == "auto" and config["gradient_clipping"] == "auto"
    assert config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is (stage == 3)


def test_launcher_precision_reaches_the_recipe(monkeypatch, tmp_path):
    """ddp_bf16.yaml: a recipe without bf16 trains (and evaluates) in bf16; a recipe asking for the other precision
    is an error naming the key; ddp.yaml ('no') leaves the recipe's choice alone."""
    monkeypatch.setenv(LAUNCHER_PRECISION_ENV, "bf16")
    args = SimCSEConfig(output_dir=str(tmp_path), use_cpu=True)
    assert args.bf16 and args.mixed_precision == "bf16"
    with pytest.raises(ValueError, match="key 'fp16'.*mixed_precision 'bf16'"):
        SimCSEConfig(output_dir=str(tmp_path), use_cpu=True, fp16=True)
    monkeypatch.setenv(LAUNCHER_PRECISION_ENV, "fp16")
    with pytest.raises(ValueError, match="key 'bf16'.*mixed_precision 'fp16'"):
        SimCSEConfig(output_dir=str(tmp_path), bf16=True)
    monkeypatch.setenv(LAUNCHER_PRECISION_ENV, "no")
    assert not SimCSEConfig(output_dir=str(tmp_path), use_cpu=True).bf16
    assert SimCSEConfig(output_dir=str(tmp_path), bf16=True).bf16


# ---------------------------------------------------------------------------------------------- global batch
def test_global_batch_gives_the_per_device_batch(tmp_path):
    """global_train_batch_size / processes per process (2 processes: tests/test_cached.py's gloo test); an error
    naming the key when it does not divide."""
    assert per_device_batch_size(512, 8) == 64 and per_device_batch_size(64, 1) == 64
    with pytest.raises(ValueError, match="global_train_batch_size=100 cannot be split evenly over 8"):
        per_device_batch_size(100, 8)
    args = SimCSEConfig(output_dir=str(tmp_path), global_train_batch_size=96, use_cpu=True)
    assert args.per_device_train_batch_size == 96 and args.world_size == 1


def test_batch_keys_on_the_command_line_replace_the_file(tmp_path, tiny_bert_dir, senteval_dir):
    """Either batch key on the command line replaces the other from the recipe file; both in one layer is an error
    from validate_recipe (before any model is loaded)."""
    corpus = tmp_path / "train.txt"
    corpus.write_text("".join(f"sentence {i}\n" for i in range(48)))  # one global batch of 48
    common = (f"method: simcse\nmodel_name_or_path: {tiny_bert_dir}\ntrain_file: {corpus}\n"
              f"sts_data_dir: {senteval_dir}\noutput_dir: {tmp_path}\n")
    per_device = tmp_path / "per_device.yaml"
    per_device.write_text(common + "per_device_train_batch_size: 16\n")
    recipe = parse_recipe(per_device, ["--global_train_batch_size", "48"])
    assert (recipe.training.per_device_train_batch_size == 48
            and "per_device_train_batch_size" not in recipe.explicit_keys)
    validate_recipe(recipe)
    global_file = tmp_path / "global.yaml"
    global_file.write_text(common + "global_train_batch_size: 48\n")
    recipe = parse_recipe(global_file, ["--per_device_train_batch_size", "8"])
    assert recipe.training.per_device_train_batch_size == 8 and recipe.training.global_train_batch_size is None
    both = tmp_path / "both.yaml"
    both.write_text(common + "global_train_batch_size: 48\nper_device_train_batch_size: 16\n")
    with pytest.raises(RecipeError, match="'global_train_batch_size' and 'per_device_train_batch_size' are both set"):
        validate_recipe(parse_recipe(both))
