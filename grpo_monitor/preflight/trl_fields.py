"""The keys a GRPO recipe may hold, read the way TRL reads them.

``trl grpo --config recipe.yaml`` hands the YAML to ``TrlParser((GRPOScriptArguments, GRPOConfig,
ModelConfig, DatasetMixtureConfig))``: ``set_defaults_with_config`` takes every key that names one of
those dataclasses' fields (``env`` sets environment variables), and what is left is handed to
``accelerate launch``, whose parser refuses anything it does not know. A script of one's own built on
``TrlParser`` or ``HfArgumentParser(GRPOConfig)`` refuses the leftovers itself
(``Unknown arguments from config file``). Either way a key no field takes stops the run before it starts.

``read_keys`` asks the installed TRL's own parser; without TRL (the ``preflight`` extra installs only
PyYAML) it falls back to the field names of TRL 1.16 below and says so.

>>> r = read_keys({"num_generation": 8, "model_name_or_path": "Qwen/Qwen3-4B", "max_prompt_length": 512})
>>> [(x["key"], x["nearest"]) for x in r["refused"]]
[('num_generation', 'num_generations'), ('max_prompt_length', 'max_completion_length')]
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Mapping
from typing import Any

FALLBACK_VERSION = "1.16"

# TRL 1.16's GRPOConfig (TrainingArguments included), as `dataclasses.fields` lists them.
_GRPO_CONFIG_1_16 = """
accelerator_config activation_checkpointing activation_checkpointing_kwargs adam_beta1 adam_beta2 adam_epsilon
auto_find_batch_size average_tokens_across_devices batch_eval_metrics beta bf16 bf16_full_eval
cache_implementation cast_lm_head_to_fp32 chat_template_kwargs data_seed dataloader_drop_last
dataloader_in_order dataloader_multiprocessing_context dataloader_num_workers dataloader_persistent_workers
dataloader_pin_memory dataloader_prefetch_factor ddp_backend ddp_broadcast_buffers ddp_bucket_cap_mb
ddp_find_unused_parameters ddp_static_graph ddp_timeout debug deepspeed delta disable_dropout disable_tqdm
do_eval do_predict do_train ds3_gather_for_generation enable_jit_checkpoint entropy_coef entropy_coef_delta
entropy_coef_max entropy_coef_min entropy_target epsilon epsilon_high eval_accumulation_steps eval_delay
eval_do_concat_batches eval_on_start eval_steps eval_strategy eval_use_gather_object fp16 fp16_full_eval fsdp
fsdp_config full_determinism generation_batch_size generation_kwargs gradient_accumulation_steps
gradient_checkpointing gradient_checkpointing_kwargs greater_is_better hub_always_push hub_model_id
hub_private_repo hub_revision hub_strategy hub_token ignore_data_skip importance_sampling_level
include_for_metrics include_num_input_tokens_seen label_names label_smoothing_factor learning_rate
length_column_name liger_kernel_config load_best_model_at_end local_rank log_completions
log_completions_hub_repo log_level log_level_replica log_multimodal log_on_each_node log_unique_prompts
logging_first_step logging_nan_inf_filter logging_steps logging_strategy loss_type lr_scheduler_kwargs
lr_scheduler_type mask_truncated_completions max_completion_length max_grad_norm max_steps
max_tool_calling_iterations metric_for_best_model min_p model_init_kwargs multi_objective_aggregation
neftune_noise_alpha num_completions_to_print num_generations num_generations_eval num_iterations
num_train_epochs off_policy_mask_threshold optim optim_args optim_target_modules output_dir pad_to_multiple_of
parallelism_config per_device_eval_batch_size per_device_train_batch_size prediction_loss_only project
push_to_hub ref_model_mixup_alpha ref_model_sync_steps remove_unused_columns repetition_penalty report_to
restore_callback_states_from_checkpoint resume_from_checkpoint reward_weights router_aux_loss_coef run_name
sapo_temperature_neg sapo_temperature_pos save_on_each_node save_only_model save_steps save_strategy
save_total_limit scale_rewards seed shuffle_dataset skip_memory_metrics steps_per_generation sync_ref_model
temperature tf32 top_entropy_quantile top_k top_p torch_compile torch_compile_backend torch_compile_mode
torch_empty_cache_steps trackio_bucket_id trackio_space_id trackio_static_space_id train_sampling_strategy
transformers_continuous_batching_config trust_remote_code use_adaptive_entropy use_bias_correction_kl use_cache
use_cpu use_liger_kernel use_transformers_continuous_batching use_transformers_paged use_vllm vespo_k_neg
vespo_k_pos vespo_lambda_neg vespo_lambda_pos vllm_enable_sleep_mode vllm_gpu_memory_utilization vllm_group_port
vllm_importance_sampling_cap vllm_importance_sampling_clip_max vllm_importance_sampling_clip_min
vllm_importance_sampling_correction vllm_importance_sampling_mode vllm_max_model_length vllm_mode
vllm_model_impl vllm_server_base_url vllm_server_host vllm_server_port vllm_server_timeout
vllm_structured_outputs_regex vllm_tensor_parallel_size warmup_steps weight_decay
"""
# trl grpo's GRPOScriptArguments, ModelConfig and DatasetMixtureConfig in TRL 1.16.
_SCRIPT_1_16 = """dataset_config dataset_name dataset_streaming dataset_test_split dataset_train_split
ignore_bias_buffers reward_funcs reward_model_name_or_path"""
_MODEL_1_16 = """attn_implementation bnb_4bit_quant_storage bnb_4bit_quant_type dtype load_in_4bit load_in_8bit
lora_alpha lora_dropout lora_modules_to_save lora_r lora_target_modules lora_target_parameters lora_task_type
model_name_or_path model_revision use_bnb_nested_quant use_dora use_peft use_rslora"""
_MIXTURE_1_16 = "datasets streaming test_split_size"
# What `trl grpo` passes on to `accelerate launch` that a recipe commonly carries (all of them when accelerate imports).
_LAUNCH = """accelerate_config config_file num_processes num_machines machine_rank main_process_ip main_process_port
mixed_precision multi_gpu use_deepspeed use_fsdp gpu_ids zero_stage"""

SOURCES = {"GRPOConfig": "GRPOConfig", "script": "trl grpo's script arguments", "model": "trl grpo's ModelConfig",
           "mixture": "trl grpo's dataset mixture", "launch": "accelerate launch (through trl grpo)",
           "env": "TrlParser's environment variables"}
# Unsloth's GRPOConfig subclass adds fields of its own; a recipe run through Unsloth is read by it, not TRL.
UNSLOTH_PREFIX = "unsloth_"


@functools.lru_cache(maxsize=1)
def accepted() -> dict[str, Any]:
    """``{"fields": {name: source}, "parser": TrlParser or None, "trl_version": str or None, "how": str}``."""
    fields: dict[str, str] = {}
    try:
        import dataclasses

        import trl
        from trl import DatasetMixtureConfig, GRPOConfig, ModelConfig, TrlParser
        from trl.scripts.grpo import GRPOScriptArguments
    except Exception:
        for source, names in (("GRPOConfig", _GRPO_CONFIG_1_16), ("script", _SCRIPT_1_16), ("model", _MODEL_1_16),
                              ("mixture", _MIXTURE_1_16), ("launch", _LAUNCH)):
            for name in names.split():
                fields.setdefault(name, source)
        fields["env"] = "env"
        return {"fields": fields, "parser": None, "trl_version": None,
                "how": f"TRL {FALLBACK_VERSION}'s field names (TRL is not installed here: keys are checked by name only)"}
    version = str(getattr(trl, "__version__", "?"))
    types = (GRPOScriptArguments, GRPOConfig, ModelConfig, DatasetMixtureConfig)
    for source, cls in zip(("script", "GRPOConfig", "model", "mixture"), types):
        for f in dataclasses.fields(cls):
            if f.init:
                fields.setdefault(f.name, source)
    try:
        from accelerate.commands.launch import launch_command_parser

        launch = {a.dest for a in launch_command_parser()._actions} - {"help", "training_script", "training_script_args"}
    except Exception:
        launch = set(_LAUNCH.split())
    for name in sorted(launch | {"accelerate_config"}):
        fields.setdefault(name, "launch")
    fields["env"] = "env"
    return {"fields": fields, "parser": lambda: TrlParser(types), "trl_version": version,
            "how": f"TRL {version}'s own parser (trl grpo's TrlParser: GRPOScriptArguments, GRPOConfig, ModelConfig)"}


# A key this close to a field (difflib's ratio) is a misspelling of it; below, the field is only the nearest.
TYPO_RATIO = 0.85
# Fields older TRL releases had and 1.16 does not, with what took their place.
REMOVED = {
    "max_prompt_length": "TRL no longer truncates prompts; filter long prompts out of the dataset, and give lint "
                         "--prompt-length to size their memory",
}


def nearest(key: str, names: Any) -> str | None:
    """The field name closest to ``key`` (difflib, case ignored), None when nothing is close."""
    names = list(names)
    by_lower = {n.lower(): n for n in names}
    got = difflib.get_close_matches(key.lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[got[0]] if got else None


def similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a.lower(), b.lower()).ratio()


def read_keys(config: Mapping[str, Any]) -> dict[str, Any]:
    """Every key of ``config`` through TRL's parser: ``refused`` (``{"key", "nearest", "why"}`` each),
    ``values`` (what TRL's parser reads each accepted key's value as: YAML 1.1's ``5e-7`` string is a float
    to it), ``sources`` (which of trl grpo's argument groups takes each key), ``trl_version`` and ``how``."""
    facts = accepted()
    fields = facts["fields"]
    version = facts["trl_version"] or FALLBACK_VERSION
    keys = [str(k) for k in config]
    unknown: list[str]
    parser = None
    if facts["parser"] is not None:
        parser = facts["parser"]()
        data = {k: v for k, v in config.items() if k != "env"}
        remaining = parser.set_defaults_with_config(**data)  # TRL's own test of a config file's keys
        # trl grpo hands these leftovers to accelerate launch, which takes its own
        unknown = [w[2:] for w in remaining[::2] if fields.get(w[2:]) != "launch"]
    else:
        unknown = [k for k in keys if k not in fields]
    refused = []
    unsloth = [k for k in unknown if k.startswith(UNSLOTH_PREFIX)]
    for key in unknown:
        if key in unsloth:
            continue
        near = nearest(key, [f for f, s in fields.items() if s != "launch"]) or nearest(key, fields)
        why = f"not a field of GRPOConfig in TRL {version}" + (
            " (nor of trl grpo's script, model or launch arguments)" if facts["parser"] is not None else "")
        refused.append({"key": key, "nearest": near, "why": why, "value": config.get(key),
                        "typo": bool(near) and similarity(key, near) >= TYPO_RATIO and key not in REMOVED,
                        **({"removed": REMOVED[key]} if key in REMOVED else {})})
    values: dict[str, Any] = {}
    bad_values = []
    if parser is not None:
        actions = {}
        for a in parser._actions:
            if a.option_strings and a.nargs != 0:
                actions.setdefault(a.dest, a)
        for key in keys:
            a = actions.get(key)
            v = config.get(key)
            if a is None or not isinstance(v, str):
                continue
            conv = a.type if callable(a.type) else None
            try:
                got = conv(v) if conv is not None else v
            except Exception:  # argparse.ArgumentTypeError from string_to_bool, ValueError from int/float
                bad_values.append({"key": key, "nearest": None, "value": v,
                                   "why": f"TRL's parser cannot read {v!r} as {getattr(conv, '__name__', 'its type')}"})
                continue
            if a.choices and str(got) not in {str(getattr(ch, "value", ch)) for ch in a.choices}:
                choices = [str(getattr(ch, "value", ch)) for ch in a.choices]
                bad_values.append({"key": key, "nearest": nearest(str(v), choices), "value": v, "choices": choices,
                                   "why": f"{v!r} is not one of the values TRL {version} takes for {key}"})
                continue
            values[key] = got
    return {"refused": refused + bad_values, "values": values, "unsloth": unsloth,
            "sources": {k: fields[k] for k in keys if k in fields}, "trl_version": facts["trl_version"],
            "how": facts["how"]}
