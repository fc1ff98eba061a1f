"""The MoE router tap on real tiny random-init transformers models and a real GRPOTrainer run."""

from __future__ import annotations

import logging
import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from grpo_monitor.callbacks.moe_models import find_routers, moe_facts  # noqa: E402
from grpo_monitor.callbacks.router_tap import RouterTap  # noqa: E402

VOCAB = 48
ARCHS = ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "gpt_oss", "deepseek_v3")
# arch -> (MoE layer indices, experts, top-k, routing distribution)
EXPECTED = {
    "qwen3_moe": ([0, 1], 8, 2, "softmax"),
    "qwen2_moe": ([0, 1], 8, 2, "softmax"),
    "mixtral": ([0, 1], 4, 2, "softmax"),
    "olmoe": ([0, 1], 8, 2, "softmax"),
    "gpt_oss": ([0, 1], 4, 2, "topk_softmax"),
    "deepseek_v3": ([1, 2], 8, 2, "sigmoid"),
}


def tiny_config(arch: str, vocab: int = VOCAB, **extra):
    T = transformers
    kw = dict(vocab_size=vocab, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
              pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, num_hidden_layers=2,
              intermediate_size=32, num_experts_per_tok=2)
    if arch == "qwen3_moe":
        cls = T.Qwen3MoeConfig
        kw.update(moe_intermediate_size=32, head_dim=8, num_experts=8)
    elif arch == "qwen2_moe":
        cls = T.Qwen2MoeConfig
        kw.update(moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=8)
    elif arch == "mixtral":
        cls = T.MixtralConfig
        kw.update(num_local_experts=4)
    elif arch == "olmoe":
        cls = T.OlmoeConfig
        kw.update(num_experts=8)
    elif arch == "gpt_oss":
        cls = T.GptOssConfig
        kw.update(head_dim=8, num_local_experts=4, layer_types=["full_attention", "sliding_attention"])
    elif arch == "deepseek_v3":
        cls = T.DeepseekV3Config
        kw.update(num_key_value_heads=4, num_hidden_layers=3, moe_intermediate_size=16, n_routed_experts=8,
                  n_group=2, topk_group=1, first_k_dense_replace=1, n_shared_experts=1, q_lora_rank=16,
                  kv_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8)
    else:
        raise ValueError(arch)
    kw.update(extra)
    return cls(**kw)


def tiny_model(arch: str, seed: int = 0, **extra):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(arch, **extra))
    model.train()
    return model


def batch(rows: int = 3, length: int = 7, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (rows, length), generator=g)


def reference_topk(arch: str, cfg, logits: torch.Tensor, k: int) -> torch.Tensor:
    """Top-k expert sets recomputed from the model's own router logits, independently of the tap."""
    if arch != "deepseek_v3":
        return logits.topk(k, dim=-1).indices.sort(-1).values
    scores = logits.float().sigmoid()
    groups = scores.view(-1, cfg.n_group, scores.shape[-1] // cfg.n_group)
    group_best = groups.topk(2, dim=-1).values.sum(-1).topk(cfg.topk_group, dim=-1).indices
    allowed = torch.zeros(scores.shape[0], cfg.n_group, dtype=torch.bool).scatter_(1, group_best, True)
    allowed = allowed.repeat_interleave(scores.shape[-1] // cfg.n_group, dim=1)
    return scores.masked_fill(~allowed, -1.0).topk(k, dim=-1).indices.sort(-1).values


def reference_entropy(kind: str, logits: torch.Tensor, k: int) -> torch.Tensor:
    x = logits.double()
    if kind == "softmax":
        return torch.distributions.Categorical(logits=x).entropy()
    if kind == "topk_softmax":
        return torch.distributions.Categorical(logits=x.topk(k, dim=-1).values).entropy()
    s = x.sigmoid()
    return torch.distributions.Categorical(probs=s / s.sum(-1, keepdim=True)).entropy()


def hook_count(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def tap_hook_count(model) -> int:
    hooks = [h for m in model.modules() for h in (*m._forward_hooks.values(), *m._forward_pre_hooks.values())]
    return sum("RouterTap" in getattr(h, "__qualname__", "") for h in hooks)


# -- discovery and config facts --------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_routers_found_by_type_and_shape(arch):
    model = tiny_model(arch)
    layers, experts, top_k, kind = EXPECTED[arch]
    tap = RouterTap.for_model(model, probe_every=10)
    assert tap is not None and tap.message is None
    assert tap.layers == layers
    assert {(r.num_experts, r.top_k, r.kind) for r in tap.routers} == {(experts, top_k, kind)}
    facts = moe_facts(model.config)
    assert facts == {"is_moe": True, "num_experts": experts, "top_k": top_k,
                     "num_layers": model.config.num_hidden_layers, "moe_layers": layers}
    # the config's dict form (what a run header stores) gives the same facts
    assert moe_facts(model.config.to_dict()) == facts


def test_moe_facts_layouts_and_dense_models():
    cfg = tiny_config("qwen3_moe", num_hidden_layers=4)
    cfg.mlp_only_layers = [0]
    cfg.decoder_sparse_step = 1
    assert moe_facts(cfg)["moe_layers"] == [1, 2, 3]
    cfg.mlp_only_layers = []
    cfg.decoder_sparse_step = 2
    assert moe_facts(cfg)["moe_layers"] == [1, 3]
    ds = tiny_config("deepseek_v3", num_hidden_layers=5)
    ds.first_k_dense_replace = 3
    assert moe_facts(ds)["moe_layers"] == [3, 4]
    dense = transformers.Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    assert moe_facts(dense) == {"is_moe": False, "num_experts": None, "top_k": None, "num_layers": 2, "moe_layers": []}
    torch.manual_seed(0)
    assert RouterTap.for_model(transformers.AutoModelForCausalLM.from_config(dense)) is None


def test_moe_model_without_readable_routers_gets_one_info_line(caplog):
    dense = transformers.Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(dense)
    model.config.num_experts = 8  # claims MoE, but no layer routes
    model.config.num_experts_per_tok = 2
    with caplog.at_level(logging.INFO, logger="grpo_monitor"):
        tap = RouterTap.for_model(model, probe_every=1)
    assert tap is not None and tap.routers == []
    assert "no router module was recognised" in tap.message
    assert [r.getMessage() for r in caplog.records if r.name == "grpo_monitor"] == ["grpo-monitor: " + tap.message]
    tap.install()
    model(input_ids=batch())
    assert tap.collect(1) == {} and tap.layer_loads == []
    tap.remove()


class _Expert(torch.nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(hidden, hidden)

    def forward(self, x):
        return self.proj(x)


class _PlainMoEBlock(torch.nn.Module):
    """An MoE block outside transformers: a bare ``nn.Linear`` gate returning logits."""

    def __init__(self, hidden: int, experts: int, top_k: int, odd_output: bool = False) -> None:
        super().__init__()
        self.scorer = torch.nn.Linear(hidden, experts, bias=False)  # neither named nor typed as a router
        self.experts = torch.nn.ModuleList(_Expert(hidden) for _ in range(experts))
        self.top_k = top_k
        self.odd_output = odd_output
        if odd_output:
            self.scorer.register_forward_hook(lambda m, a, out: {"logits": out})

    def forward(self, x):
        b, t, h = x.shape
        flat = x.reshape(-1, h)
        out = self.scorer(flat)
        logits = out["logits"] if self.odd_output else out
        w, idx = logits.softmax(-1).topk(self.top_k, dim=-1)
        y = torch.zeros_like(flat)
        for slot in range(self.top_k):
            for e, expert in enumerate(self.experts):
                sel = idx[:, slot] == e
                y[sel] += w[sel, slot, None] * expert(flat[sel])
        return (flat + y).reshape(b, t, h)


class _PlainMoEModel(torch.nn.Module):
    def __init__(self, odd_output: bool = False) -> None:
        super().__init__()
        self.config = transformers.PretrainedConfig(hidden_size=16, num_hidden_layers=2, num_local_experts=4,
                                                    num_experts_per_tok=2)
        self.embed = torch.nn.Embedding(VOCAB, 16)
        self.layers = torch.nn.ModuleList(_PlainMoEBlock(16, 4, 2, odd_output) for _ in range(2))

    def forward(self, input_ids, attention_mask=None):
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h)
        return h


def test_router_found_by_shape_next_to_its_experts_and_bare_logits_read():
    torch.manual_seed(0)
    model = _PlainMoEModel()
    tap = RouterTap.for_model(model, probe_every=None, record_routing=True).install()
    assert tap.layers == [0, 1] and tap.message is None
    ids = batch()
    model(ids).sum().backward()
    metrics = tap.collect(1)
    assert metrics["moe/tokens"] == ids.numel()
    h = model.embed(ids).reshape(-1, 16)
    expected = model.layers[0].scorer(h).detach()
    logits, idx = tap.last_routing[0]
    assert torch.equal(logits, expected)
    assert torch.equal(idx.sort(-1).values, expected.topk(2, dim=-1).indices.sort(-1).values)
    tap.remove()


def test_router_with_unreadable_output_is_left_out_with_a_message(caplog):
    torch.manual_seed(0)
    model = _PlainMoEModel(odd_output=True)
    tap = RouterTap.for_model(model, probe_every=None).install()
    with caplog.at_level(logging.INFO, logger="grpo_monitor"):
        model(batch()).sum().backward()
        model(batch()).sum().backward()
    assert tap.collect(1) == {}
    assert "cannot read" in tap.message and "layer 0" in tap.message and "layer 1" in tap.message
    assert len([r for r in caplog.records if r.name == "grpo_monitor"]) == 2  # once per layer, not per call
    tap.remove()


# -- what the tap measures -------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_captured_routing_equals_the_models_own_router_output(arch):
    model = tiny_model(arch)
    _, experts, top_k, kind = EXPECTED[arch]
    tap = RouterTap.for_model(model, probe_every=None, record_routing=True).install()
    ids = batch()
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_router_logits=True)
    out.logits.float().mean().backward()
    assert len(out.router_logits) == len(tap.routers)
    counts = torch.zeros(len(tap.routers), experts)
    entropies = []
    for i, (spec, own) in enumerate(zip(tap.routers, out.router_logits)):
        logits, idx = tap.last_routing[spec.layer]
        own = own.detach()
        assert torch.equal(logits, own)
        assert torch.equal(idx.sort(-1).values, reference_topk(arch, model.config, own, top_k))
        counts[i] = torch.bincount(idx.reshape(-1), minlength=experts).float()
        entropies.append(reference_entropy(kind, own, top_k).mean().item())
    metrics = tap.collect(1)
    loads = counts / counts.sum(-1, keepdim=True)
    assert torch.allclose(torch.tensor(tap.layer_loads), loads, atol=1e-4)
    for row in tap.layer_loads:
        assert sum(row) == pytest.approx(1.0, abs=1e-3)
    cv = (loads.std(-1, unbiased=False) / loads.mean(-1)).mean().item()
    assert metrics["moe/load_cv"] == pytest.approx(cv, rel=1e-5)
    assert metrics["moe/load_max_over_mean"] == pytest.approx((loads.max(-1).values * experts).max().item(), rel=1e-5)
    assert metrics["moe/router_entropy"] == pytest.approx(sum(entropies) / len(entropies), rel=1e-5)
    top = math.log(top_k if kind == "topk_softmax" else experts)
    assert metrics["moe/router_entropy_normalized"] == pytest.approx(metrics["moe/router_entropy"] / top, rel=1e-5)
    assert metrics["moe/tokens"] == ids.numel()
    # accumulators were reset: nothing new since the last collect
    assert tap.collect(2) == {} and tap.layer_loads == []
    tap.remove()


@pytest.mark.parametrize("arch", ARCHS)
def test_padding_is_excluded(arch):
    model = tiny_model(arch)
    tap = RouterTap.for_model(model, probe_every=None).install()
    a, b = batch(1, 7, seed=3), batch(1, 4, seed=4)
    padded = torch.cat([a, torch.cat([b, torch.zeros(1, 3, dtype=torch.long)], dim=1)])
    mask = torch.ones_like(padded)
    mask[1, 4:] = 0  # right padding: real tokens keep their positions and hidden states
    model(input_ids=padded, attention_mask=mask)
    with_padding = tap.collect(1), tap.layer_loads
    model(input_ids=a, attention_mask=torch.ones_like(a))
    model(input_ids=b, attention_mask=torch.ones_like(b))
    separate = tap.collect(2), tap.layer_loads
    assert with_padding[0]["moe/tokens"] == separate[0]["moe/tokens"] == 11
    assert with_padding[1] == separate[1]
    assert with_padding[0]["moe/router_entropy"] == pytest.approx(separate[0]["moe/router_entropy"], rel=1e-5)
    model(input_ids=padded)  # no mask: every position counts
    assert tap.collect(3)["moe/tokens"] == 14
    tap.remove()


@pytest.mark.parametrize("arch", ARCHS)
def test_flip_rate_zero_without_update_and_positive_after_a_large_step(arch):
    model = tiny_model(arch)
    tap = RouterTap.for_model(model, probe_every=1).install()
    ids = batch(4, 12)
    mask = torch.ones_like(ids)
    mask[2:, 9:] = 0

    def train_forward():
        return model(input_ids=ids, attention_mask=mask).logits.float().logsumexp(-1).mean()

    train_forward().backward()
    first = tap.collect(1)
    assert "moe/flip_rate" not in first  # first probe is the baseline
    model.zero_grad()
    train_forward()
    same = tap.collect(2)
    assert same["moe/flip_rate"] == 0.0
    assert same["moe/flip_rate_steps"] == 1.0
    assert {f"moe/flip_rate/layer_{i}" for i in tap.layers} <= same.keys()
    # the probe ran outside training: its forward is not in the load accumulators
    assert same["moe/tokens"] == mask.sum().item()
    assert model.training  # train mode restored after the eval-mode probe

    opt = torch.optim.Adam(model.parameters(), lr=0.5)
    loss = train_forward()
    loss.backward()
    opt.step()
    moved = tap.collect(3)
    assert 0.0 < moved["moe/flip_rate"] <= 1.0
    assert any(moved[f"moe/flip_rate/layer_{i}"] > 0 for i in tap.layers)
    tap.remove()


def test_probe_runs_every_k_global_steps():
    model = tiny_model("qwen3_moe")
    tap = RouterTap.for_model(model, probe_every=3).install()
    model(input_ids=batch()).logits.sum().backward()
    probed = [s for s in range(1, 11) if "moe/flip_rate" in tap.collect(s)]
    assert probed == [3, 6, 9]
    tap.remove()


@pytest.mark.parametrize("arch", ARCHS)
def test_generation_and_checkpoint_replays_are_not_counted(arch):
    model = tiny_model(arch)
    tap = RouterTap.for_model(model, probe_every=None).install()
    raw_calls = []
    handles = [r.module.register_forward_hook(lambda *a: raw_calls.append(1)) for r in tap.routers]
    ids = batch(2, 6)
    model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False,
                   pad_token_id=0)
    assert len(raw_calls) >= 4 * len(tap.routers)  # routers did run during decoding
    assert tap.collect(1) == {}

    def train_step():
        raw_calls.clear()
        model.zero_grad()
        model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float().mean().backward()
        return tap.collect(2), tap.layer_loads, len(raw_calls)

    plain, plain_loads, plain_calls = train_step()
    for reentrant in (False, True):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": reentrant})
        model.train()
        ckpt, ckpt_loads, ckpt_calls = train_step()
        model.activation_checkpointing_disable()
        assert ckpt_calls == 2 * plain_calls  # every router ran again in the backward replay
        assert ckpt["moe/tokens"] == plain["moe/tokens"] == ids.numel()
        assert ckpt_loads == plain_loads
    for h in handles:
        h.remove()
    tap.remove()


@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v3"])
def test_install_is_idempotent_and_remove_leaves_no_hooks(arch):
    model = tiny_model(arch)
    before = hook_count(model)
    tap = RouterTap.for_model(model, probe_every=2)
    tap.install()
    installed = hook_count(model)
    tap.install()
    assert hook_count(model) == installed == before + 2  # router hooks live only inside a recorded forward
    attached = []
    probe = tap.routers[0].module.register_forward_hook(lambda *a: attached.append(tap_hook_count(model)))
    model(input_ids=batch()).logits.sum().backward()
    with torch.no_grad():
        model(input_ids=batch())
    probe.remove()
    assert attached == [len(tap.routers) + 2, 2]  # attached for training, not for a no-grad forward
    assert tap_hook_count(model) == 2
    assert tap.collect(0)["moe/tokens"] == batch().numel()  # the training forward only
    tap.remove()
    assert hook_count(model) == before and tap_hook_count(model) == 0
    model(input_ids=batch()).logits.sum().backward()
    assert tap.collect(1) == {}


def test_wrapped_model_is_read_through_its_wrapper():
    model = tiny_model("olmoe")

    class Wrapper(torch.nn.Module):  # the shape of DistributedDataParallel: the model sits in .module
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, **kw):
            return self.module(**kw)

    tap = RouterTap.for_model(Wrapper(model), probe_every=None).install()
    assert tap.layers == [0, 1]
    Wrapper(model)(input_ids=batch()).logits.sum().backward()
    assert tap.collect(1)["moe/tokens"] == batch().numel()
    tap.remove()


def test_found_routers_are_the_ones_the_model_calls():
    model = tiny_model("qwen2_moe")
    routers, problem = find_routers(model)
    assert problem is None
    # the shared-expert gate (hidden -> 1) is not a router
    assert [r.name for r in routers] == ["model.layers.0.mlp.gate", "model.layers.1.mlp.gate"]


# -- a real GRPO run ------------------------------------------------------------------------------


def _tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<bos>", "<eos>", "<unk>"] + [f"w{i}" for i in range(VOCAB - 4)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>",
                                                eos_token="<eos>", unk_token="<unk>")


def test_grpo_trainer_run_logs_moe_metrics(tmp_path):
    datasets = pytest.importorskip("datasets")
    trl = pytest.importorskip("trl")

    tokenizer = _tiny_tokenizer()
    model = tiny_model("qwen3_moe")
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 2
    prompts = [" ".join(f"w{(i * 7 + j) % 40}" for j in range(3 + i % 4)) for i in range(16)]
    dataset = datasets.Dataset.from_dict({"prompt": prompts})

    def reward_len(completions, **kwargs):
        return [float(len(c.split())) for c in completions]

    seen: list[dict] = []

    class TapCallback(transformers.TrainerCallback):
        tap = None

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self.tap = RouterTap.for_model(model, probe_every=2)
            self.tap.install()

        def on_log(self, args, state, control, logs=None, model=None, **kwargs):
            if logs is None or "train_runtime" in logs:
                return
            logs.update(self.tap.collect(state.global_step))
            seen.append({"step": state.global_step, **logs, "loads": self.tap.layer_loads,
                         "tap_hooks": tap_hook_count(model)})

        def on_train_end(self, args, state, control, **kwargs):
            self.tap.remove()

    config = trl.GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                            max_completion_length=6, max_steps=3, logging_steps=1, learning_rate=5e-2,
                            bf16=False, use_cpu=True, use_vllm=False, report_to="none", save_strategy="no",
                            seed=3, gradient_checkpointing=True)
    callback = TapCallback()
    trainer = trl.GRPOTrainer(model=model, reward_funcs=reward_len, args=config, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[callback])
    trainer.train()
    assert [r["step"] for r in seen] == [1, 2, 3]
    for record in seen:
        for key in ("moe/load_cv", "moe/load_max_over_mean", "moe/router_entropy",
                    "moe/router_entropy_normalized", "moe/tokens"):
            assert math.isfinite(record[key]), key
        assert 0 < record["moe/router_entropy_normalized"] <= 1
        assert len(record["loads"]) == 2 and all(sum(r) == pytest.approx(1, abs=1e-3) for r in record["loads"])
        # training forward only: 4 completions per step, prompt + completion tokens, no padding
        assert 0 < record["moe/tokens"] <= 4 * (max(len(p.split()) for p in prompts) + 6)
    assert "moe/flip_rate" not in seen[0]  # baseline probe
    assert "moe/flip_rate" in seen[1] and 0.0 <= seen[1]["moe/flip_rate"] <= 1.0
    assert "moe/flip_rate/layer_0" in seen[1] and "moe/flip_rate/layer_1" in seen[1]
    assert "moe/flip_rate" not in seen[2]
    assert seen[0]["tap_hooks"] == 2  # the decoder's enter/leave hooks; router hooks only inside forwards
    assert tap_hook_count(trainer.model) == 0  # removed at train end
