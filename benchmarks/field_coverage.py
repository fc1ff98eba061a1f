"""Which detector or pre-flight check catches each of the 120 GRPO failures reported in the field.

The catalogue (``../shared/FIELD-FAILURES.md``, section 1) numbers the reports #1..#120 in classes K1..K19,
each with the metric signature the thread shows. ``REPORTS`` maps every report, by that signature, to
the detector ids (``grpo_monitor.detectors.base.DETECTOR_IDS``) and pre-flight checks (``config_*``
findings of ``grpo-monitor lint``; the reward gate's checks; the ``inspect_rewards`` gate itself) that
read it, or says why nothing does.

    .venv/bin/python benchmarks/field_coverage.py           # validate, count, write the RESULTS.md section
    .venv/bin/python benchmarks/field_coverage.py --check   # validate and count only

Every named id must exist: the script names each one that does not (on stderr and in the table) and exits 1.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (class, signature in a few words, catchers) per report; catchers is a tuple of detector ids and
# pre-flight check names, or the string "not covered: <why>".
REPORTS: dict[int, tuple[str, str, tuple[str, ...] | str]] = {
    # K1 truncation at the completion cap kills the reward
    1: ("K1", "clipped_ratio 1, reward 0, grad_norm 0 from step 1 (cap 256)",
        ("truncation", "no_learning_signal", "config_max_completion_length", "gate_truncation")),
    2: ("K1", "256 cap truncates 50-80% of chains of thought", ("truncation", "config_max_completion_length", "gate_truncation")),
    3: ("K1", "mean_length at cap, clipped 1, terminated 0, zero std", ("truncation", "no_learning_signal", "gate_truncation")),
    4: ("K1", "min=max=mean length 80, clipped 1 on 39/40 steps", ("truncation", "no_learning_signal", "gate_truncation")),
    5: ("K1", "clipped_ratio 1.0 for long stretches", ("truncation",)),
    6: ("K1", "length falls under high clipped_ratio", ("truncation",)),
    7: ("K1", "format component falls to 0 as length reaches the cap", ("truncation",)),
    8: ("K1", "clip rate ~20% with weak reward", ("truncation",)),
    9: ("K1", "actions truncated before they parse", ("truncation", "gate_truncation")),
    10: ("K1", "reward falls as truncation nears 100%", ("truncation",)),
    # K2 zero reward variance or zero gradient
    11: ("K2", "reward_std 0, frac_reward_zero_std 1 while rewards/f/std 5.08", ("no_learning_signal",)),
    12: ("K2", "loss and grad_norm always 0", ("no_learning_signal",)),
    13: ("K2", "total reward std always 0, grad_norm 0", ("no_learning_signal",)),
    14: ("K2", "both reward components always 1", ("reward_function_bug", "no_learning_signal")),
    15: ("K2", "loss 0: no completion hits the format", ("no_learning_signal",)),
    16: ("K2", "reward always 0 (format never emitted)", ("no_learning_signal",)),
    17: ("K2", "reward stays at 0", ("no_learning_signal",)),
    18: ("K2", "rollout score zero", ("no_learning_signal",)),
    19: ("K2", "grad_norm 0 while reward_std > 0", ("no_learning_signal",)),
    # K3 reward-function and chat-template bugs
    20: ("K3", "format components pinned at 0 while total rises", ("reward_function_bug", "gate_constant_reward")),
    21: ("K3", "format_reward always 0", ("reward_function_bug", "gate_constant_reward")),
    22: ("K3", "format reward always 0, accuracy flat", ("reward_function_bug", "gate_constant_reward")),
    23: ("K3", "accuracy 1.0 on unparsable gold answers", ("inspect_rewards",)),
    24: ("K3", "one value broadcast to every completion, reward_std 0", ("reward_function_bug", "no_learning_signal", "gate_constant_reward")),
    25: ("K3", "template opens <think>, format reward always 0", ("reward_function_bug", "gate_template_scaffold")),
    26: ("K3", "format reward 0 throughout", ("reward_function_bug", "gate_constant_reward")),
    27: ("K3", "format rising, accuracy near 0", ("reward_component_divergence",)),
    # K4 reward hacking and proxy-component divergence
    28: ("K4", "format 0.48->0.86, accuracy 0.16->0.064, length halves", ("reward_component_divergence", "length_collapse")),
    29: ("K4", "format reaches 1, accuracy 0 all run", ("reward_component_divergence",)),
    30: ("K4", "format near 1, accuracy creeps to 0.6", ("reward_component_divergence",)),
    31: ("K4", "reward tracks only the format component", ("reward_component_divergence",)),
    32: ("K4", "plateau then hacking of a single reward, held-out score falls", ("train_eval_divergence",)),
    33: ("K4", "repeated text that the reward scores highly, held-out score falls", ("train_eval_divergence",)),
    34: ("K4", "keyword-overlap reward climbs, the judge's held-out score stays flat", ("train_eval_divergence",)),
    35: ("K4", "additive format reward pushes 8k-token responses", ("length_reward_coupling",)),
    36: ("K4", "shaped length term: length to 1 token, exact match to 0", ("length_reward_coupling", "length_collapse")),
    37: ("K4", "length reward fills the cap, reward_std flat", ("length_reward_coupling", "truncation", "no_learning_signal")),
    38: ("K4", "format-only reward, grad spikes, language shifts",
         ("reward_component_divergence", "grad_norm_spike", "language_mixing")),
    # K5 length runaway, repetition, degenerate output at the cap
    39: ("K5", "outputs repeat and fill the context", ("degenerate_long_cot", "truncation")),
    40: ("K5", "format rises then falls, repetition, reward to 0", ("degenerate_long_cot", "sudden_collapse")),
    41: ("K5", "late collapses when length hits the cap", ("degenerate_long_cot", "truncation")),
    42: ("K5", "irrelevant content up to max tokens", ("degenerate_long_cot",)),
    43: ("K5", "length keeps increasing, then collapse", ("degenerate_long_cot", "truncation")),
    44: ("K5", "response length grows steadily (length is free)", ("length_reward_coupling",)),
    45: ("K5", "multilingual garbage with no EOS", ("degenerate_long_cot", "language_mixing")),
    # K6 length collapse
    46: ("K6", "length keeps decreasing, format reward 0 throughout", ("length_collapse", "reward_function_bug")),
    47: ("K6", "response_length/mean decreasing", ("length_collapse",)),
    # K7 entropy rise
    48: ("K7", "entropy explosion from an inherited entropy_coeff", ("entropy_rise",)),
    49: ("K7", "entropy climbs to 2.0 under clip-high", ("entropy_rise",)),
    50: ("K7", "unexpected entropy increase", ("entropy_rise",)),
    51: ("K7", "entropy trends up all run, outputs garble", ("entropy_rise", "degenerate_long_cot")),
    52: ("K7", "entropy and kl rising fast, then collapse", ("entropy_rise", "sudden_collapse")),
    # K8 entropy collapse
    53: ("K8", "entropy collapse on an MoE model", ("entropy_collapse", "moe_model_detected")),
    # K9 sudden collapse or KL blow-up
    54: ("K9", "score 1.3 -> 0 at steps 270-300, multilingual gibberish", ("sudden_collapse", "language_mixing")),
    55: ("K9", "run explodes around step 160", ("sudden_collapse",)),
    56: ("K9", "sudden collapse around step 600", ("sudden_collapse",)),
    57: ("K9", "abnormal reward curve, collapse", ("sudden_collapse",)),
    58: ("K9", "sudden reward drop", ("sudden_collapse",)),
    59: ("K9", "validation score drops after step 60 while training looks fine", ("eval_drop",)),
    60: ("K9", "reward to 0 after 650 steps, outputs all '!!!!'", ("sudden_collapse", "broken_generation")),
    61: ("K9", "accuracy reward to 0, KL extremely large", ("sudden_collapse",)),
    62: ("K9", "collapse without a KL anchor", ("sudden_collapse", "config_beta")),
    63: ("K9", "accuracy 57% -> 2.4% at lr 5e-5", ("sudden_collapse", "config_learning_rate")),
    64: ("K9", "KL very high around step 200, accuracy rises then falls", ("sudden_collapse",)),
    65: ("K9", "garbled output under DAPO", ("entropy_rise", "degenerate_long_cot")),
    66: ("K9", "collapse with too many inner iterations", ("sudden_collapse",)),
    67: ("K9", "score drops sharply late, entropy collapses or explodes", ("sudden_collapse", "entropy_collapse", "entropy_rise")),
    68: ("K9", "policy-gradient loss diverges with KL off", ("grad_norm_spike", "config_beta")),
    69: ("K9", "IoU reward drops and oscillates late", ("sudden_collapse",)),
    # K10 broken generator
    70: ("K10", "all responses '!!!!' after the first update", ("broken_generation",)),
    71: ("K10", "gibberish from step 1", ("broken_generation",)),
    72: ("K10", "random responses after step 1, reward only at step 1", ("broken_generation",)),
    73: ("K10", "'!!!!' (token 0) from the beginning", ("broken_generation",)),
    74: ("K10", "vLLM weights never synced: training does nothing", ("broken_generation", "rollout_mismatch")),
    75: ("K10", "reward does not continue after a LoRA resume", ("rollout_mismatch",)),
    76: ("K10", "vLLM with LoRA does not learn (stale adapter)", ("rollout_mismatch",)),
    # K11 non-finite values
    77: ("K11", "NaN policy loss, reward 0, '!!!!'", ("non_finite", "broken_generation")),
    78: ("K11", "NaN loss hidden by the logging filter", ("non_finite",)),
    79: ("K11", "NaN loss, entropy, grad_norm with num_generations=1", ("non_finite", "config_num_generations")),
    80: ("K11", "NaN advantages: loss 0, grad_norm NaN", ("non_finite",)),
    81: ("K11", "grad_norm nan, then inf/nan probabilities", ("non_finite",)),
    82: ("K11", "grad_norm NaN on 4 GPUs", ("non_finite",)),
    83: ("K11", "actor grad norms always NaN", ("non_finite",)),
    84: ("K11", "entropy and KL loss sometimes NaN", ("non_finite",)),
    # K12 train-inference mismatch (dense)
    85: ("K12", "first-token IS ratio 2.0 at temperature 0.6", ("rollout_mismatch",)),
    86: ("K12", "IS ratio equals the kept mass (0.108 at top_k 20)", ("rollout_mismatch",)),
    87: ("K12", "sequence IS ratio mean 0.4-0.7", ("rollout_mismatch",)),
    88: ("K12", "collapses with vLLM, not with SGLang", ("sudden_collapse", "rollout_mismatch")),
    89: ("K12", "logprob difference rises ~100 steps before failure", ("rollout_mismatch",)),
    90: ("K12", "logprob abs diff 0.011 -> 0.036 over 30 steps", ("rollout_mismatch",)),
    91: ("K12", "VLM logprob ratio above 1.05", ("config_vlm",)),
    92: ("K12", "ratio occasionally 5e8, KL-loss spikes", ("rollout_mismatch", "grad_norm_spike")),
    93: ("K12", "KL mean 1.57e6 at step 9", ("sudden_collapse",)),
    # K13 MoE routing
    94: ("K13", "router disagreement, 3 of 3 MoE runs collapse", ("moe_instability", "config_moe_gspo")),
    95: ("K13", "MoE train/generation logprob divergence", ("moe_instability", "rollout_mismatch")),
    # K14 gradient-norm spikes
    96: ("K14", "grad_norm increasingly spiky with clip_ratio", ("grad_norm_spike",)),
    97: ("K14", "grad norms ~1200 with max_grad_norm 0.5", ("grad_norm_spike",)),
    98: ("K14", "grad_norm routinely in the tens",
         "not covered: a steady high level is the run's own baseline (the maintainer called it normal); only "
         "spikes above it are a signal"),
    # K15 no improvement despite a signal
    99: ("K15", "LoRA, lr 5e-7, num_generations 2, no learning", ("no_improvement", "config_num_generations")),
    100: ("K15", "reward weaves back and forth, never rises", ("no_improvement",)),
    101: ("K15", "accuracy reward oscillates", ("no_improvement",)),
    102: ("K15", "rewards plateau (G=8)", ("no_improvement",)),
    103: ("K15", "reward low, not increasing (G=6)", ("no_improvement", "config_num_generations")),
    104: ("K15", "reward flat after 300 iterations, group size 2", ("no_improvement", "config_num_generations")),
    # K16 advantage or mask bugs
    105: ("K16", "normalised rewards around 1e-9", ("advantage_mask_bug",)),
    106: ("K16", "min = max = mean completion length, loss always 0", ("advantage_mask_bug",)),
    # K17 out of memory
    107: ("K17", "OOM during rollout", ("memory_pressure", "config_vllm_memory")),
    108: ("K17", "OOM at step 4 in backward", ("memory_pressure",)),
    109: ("K17", "OOM at the third step (vLLM memory share)", ("memory_pressure", "config_vllm_memory")),
    110: ("K17", "OOM on the second backward at 20k tokens (logits)", ("memory_pressure", "config_memory")),
    111: ("K17", "OOM with 32k responses on a 7B", ("memory_pressure", "config_memory")),
    112: ("K17", "OOM at ~10k response length", ("memory_pressure", "config_memory")),
    # K18 hangs and stalls
    113: ("K18", "NCCL timeout at weight sync", ("stall",)),
    114: ("K18", "socket timeout after the first steps", ("stall",)),
    115: ("K18", "hang at the second rollout", ("stall",)),
    116: ("K18", "timeout after 90 steps during a weight update", ("stall",)),
    117: ("K18", "hang after ~5 h with no error", ("stall",)),
    118: ("K18", "never gets past step 0",
          "not covered: no step is ever logged, so there is no step time to measure a stall against"),
    # K19 language mixing
    119: ("K19", "language mixing in long responses", ("language_mixing",)),
    120: ("K19", "switches between Chinese and English", ("language_mixing",)),
}

CLASS_NAMES = {
    "K1": "Truncation kills reward", "K2": "Zero variance / zero gradient", "K3": "Reward/template bugs",
    "K4": "Hacking / divergence", "K5": "Length runaway / repetition", "K6": "Length collapse", "K7": "Entropy rise",
    "K8": "Entropy collapse", "K9": "Sudden collapse / KL blow-up", "K10": "Broken generator", "K11": "Non-finite",
    "K12": "Train-inference mismatch", "K13": "MoE routing", "K14": "Grad-norm spikes", "K15": "No improvement",
    "K16": "Advantage/mask bugs", "K17": "OOM", "K18": "Hang", "K19": "Language mixing",
}


def covered(n: int) -> bool:
    return not isinstance(REPORTS[n][2], str)


def lint_ids() -> set[str]:
    """Every ``config_*`` finding the pre-flight lint (and the memory estimate it calls) can raise."""
    ids: set[str] = set()
    for path in (ROOT / "grpo_monitor").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        ids.update("config_" + r for r in re.findall(r'_finding\(\s*"([a-z0-9_]+)"', text))
        ids.update(re.findall(r'detector\s*=\s*"(config_[a-z0-9_]+)"', text))
    return ids


def gate_ids() -> set[str]:
    """The reward gate's named checks (``GATE_CHECKS``, as ``gate_<check>``) and the gate itself."""
    from grpo_monitor.preflight.reward_gate import GATE_CHECKS

    ids = {f"gate_{c}" for c in GATE_CHECKS}
    if 'add_parser("inspect-rewards"' in (ROOT / "grpo_monitor" / "app" / "cli.py").read_text(encoding="utf-8"):
        ids.add("inspect_rewards")
    return ids


def known_ids() -> set[str]:
    from grpo_monitor.detectors import DETECTOR_IDS

    return set(DETECTOR_IDS) | lint_ids() | gate_ids()


def missing_ids() -> dict[str, list[int]]:
    """Each named id that exists nowhere, with the reports naming it."""
    known = known_ids()
    out: dict[str, list[int]] = {}
    for n, (_, _, catchers) in sorted(REPORTS.items()):
        if isinstance(catchers, str):
            continue
        for c in catchers:
            if c not in known:
                out.setdefault(c, []).append(n)
    return out


def counts() -> dict[str, tuple[int, int]]:
    """Per class: (reports, covered)."""
    total: Counter[str] = Counter()
    hit: Counter[str] = Counter()
    for n, (cls, _, _) in REPORTS.items():
        total[cls] += 1
        hit[cls] += covered(n)
    return {cls: (total[cls], hit[cls]) for cls in sorted(total, key=lambda c: int(c[1:]))}


def table() -> str:
    from benchmarks.results import stamp

    per_class = counts()
    n_cov = sum(c for _, c in per_class.values())
    lines = [
        "## Field failures covered (`benchmarks/field_coverage.py`)", "", stamp(), "",
        f"The 120 failure reports of `../shared/FIELD-FAILURES.md` (section 1), each mapped by its metric signature to "
        f"the detectors and pre-flight checks that read it: **{n_cov} of {len(REPORTS)} covered**. The mapping is data "
        "in the script, which checks that every named detector and check exists.", "",
    ]
    missing = missing_ids()
    if missing:
        lines += [f"**Not found when this was written** (rerun once they exist): {', '.join(f'`{c}`' for c in missing)}.", ""]
    lines += ["| class | reports | covered | not covered |", "|---|---|---|---|"]
    for cls, (total, hit) in per_class.items():
        gaps = ", ".join(f"#{n}" for n in sorted(REPORTS) if REPORTS[n][0] == cls and not covered(n)) or "—"
        lines.append(f"| {cls} {CLASS_NAMES[cls]} | {total} | {hit} | {gaps} |")
    lines += ["", "| # | class | signature | caught by |", "|---|---|---|---|"]
    for n, (cls, sig, catchers) in sorted(REPORTS.items()):
        by = ", ".join(f"`{c}`" for c in catchers) if not isinstance(catchers, str) else f"*{catchers}*"
        lines.append(f"| {n} | {cls} | {sig} | {by} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="validate and count only; do not write RESULTS.md")
    args = ap.parse_args(argv)
    per_class = counts()
    for cls, (total, hit) in per_class.items():
        print(f"{cls:<4} {CLASS_NAMES[cls]:<30} {hit:>3}/{total}")
    n_cov = sum(c for _, c in per_class.values())
    print(f"covered {n_cov} of {len(REPORTS)}; not covered: {', '.join(f'#{n}' for n in sorted(REPORTS) if not covered(n))}")
    missing = missing_ids()
    for c, reports in missing.items():
        print(f"MISSING: {c} (named for {', '.join(f'#{n}' for n in reports)}) is neither a detector id nor a "
              "pre-flight check", file=sys.stderr)
    if not args.check:
        from benchmarks.results import update_section

        # Written either way, so the table is there to read; ids not found yet are named in it and the
        # exit status stays 1 until a rerun finds them all.
        update_section("field_coverage", table())
        print("wrote the field_coverage section of benchmarks/RESULTS.md")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
