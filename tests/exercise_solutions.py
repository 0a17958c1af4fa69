"""The exercises' answers, for tests/course/test_exercises.py (kept out of the notebooks learners open).

For each lesson (by notebook name), each exercise cell (a code cell that sets ``answer = None``),
found by a phrase that only that cell contains: (a correct answer, a plausible wrong one), as
source text. tests/course/test_exercises.py puts both in place of ``None`` and runs the lesson's checker
on each.
"""

SOLUTIONS = {
    "00_start_here": {
        "fp16 store for it": ("65504", "65519"),
        "fp16 without a scaler stalls, while bf16": ('"b"', '"a"'),  # wrong: blaming fp16's precision
        "stores 1000.1 as 1000 in fp16. Why?": ('"d"', '"a"'),  # wrong: thinking fp16 rounds to decimal digits
    },
    "01_fp16_range": {
        "Is the update -2**-11 lost": ('"no"', '"yes"'),
        "turn 500.0 into in fp8 E4M3": ("448", 'float("nan")'),  # wrong: ml_dtypes' answer, not torch's
        "float8_e4m3fnuz": ('"2^-10"', "2**-9"),  # wrong: E4M3's own smallest
        "What does bf16 turn 65520.0 into": ("65536", "float('inf')"),
        "A bf16 weight is 256.0": ('"yes"', '"no"'),
        "the weight is 3000 times larger": ('"no"', '"yes"'),
        "keep an fp32 master copy of the weights": ('"c"', '"b"'),  # wrong: mixing up lost updates with underflow
        "bf16 has fp32's range, yet": ('"a"', '"c"'),  # wrong: crediting the bias with the range
    },
    "02_loss_scaling": {
        "Predict: what is the largest power-of-two loss scale": ("2**33", "2**34"),
        "its largest gradient is 3e-3": ("2**24", "2**25"),  # wrong: 2^25 x 3e-3 = 100,663 overflows
        "does fp16 lose \"more\" or \"fewer\"": ('"more"', '"fewer"'),
        "What does it do with that step": ('"skip"', '"clip"'),
        "Why does multiplying the loss by S": ('"b"', '"a"'),  # wrong: thinking larger values are more precise
        "a tenth of fp32's weight gradients become 0": ('"d"', '"a"'),  # wrong: thinking autocast's loss is fp16
    },
    "03a_autocast": {
        "torch.softmax(lin(x), dim=-1)": ('"fp16"', '"fp32"'),  # wrong: what CUDA autocast gives
        'reduction="sum"': ('"skipped"', '"runs"'),  # wrong: trusting the fp32 loss to protect the backward
        "from inside your own fp16 autocast block": ("1", "2"),  # wrong: thinking the inner exits empty the cache
        "softmax runs in fp16 under CPU autocast": ('"b"', '"c"'),  # wrong: thinking autocast casts outputs
        "y2 is computed with the old weight": ('"b"', '"c"'),  # wrong: blaming rounding for the stale copy
    },
    "03b_bf16_in_practice": {
        "Stochastic rounding sends 3.01": ("0.64", "0.5"),
        "bf16 none. Why?": ('"b"', '"a"'),  # wrong: thinking bf16 is the more precise format
        "stops learning at step 71": ('"b"', '"a"'),  # wrong: blaming underflow, fp16's problem
        "8 times smaller than bf16's": ('"b"', '"a"'),  # wrong: thinking TF32 accumulates in more precision
        "def stochastic_round": (
            '__import__("ampviz.training.bf16", fromlist=["stochastic_round_bf16"]).stochastic_round_bf16',
            "lambda x, generator: x.to(__import__('torch').bfloat16)"),  # wrong: round to nearest
    },
    "04_gradscaler_internals": {
        "take the default scale 2^16 to exactly 0": ("166", "165"),
        "the steps \"..x....\"": ("65536", "32768"),  # wrong: forgetting the growth after three clean steps
        "Which test tells you": ('"b"', '"a"'),
        "what gradient norm does the optimizer apply": ("5 / 2**10", "5"),
        "look for inf and NaN before it calls optimizer.step()": ('"b"', '"c"'),  # wrong: expecting the step redone
        "exactly 0 after 166 overflows": ('"c"', '"b"'),  # wrong: thinking float32 flushes subnormals to 0
        "come before clip_grad_norm_": ('"b"', '"a"'),  # wrong: thinking the scaled gradients are fp16
        "def train_step": (
            '__import__("ampviz.training.gradscaler", fromlist=["amp_step_reference"]).amp_step_reference',
            "lambda model, optimizer, scaler, x, y: optimizer.step()"),
    },
    "05_gradscaler_in_a_real_loop": {
        "how many of the next 12 steps are skipped": ("8", "0"),  # wrong: expecting a restored scaler
        "loss spikes in micro-batches": ("512", "256"),  # wrong: one backoff per spiking micro-batch
        "Optimizer a applies its right gradient times what factor": ("1", "2"),  # wrong: section 2's factor for b
        "Does the scale test": ('"yes"', '"no"'),  # wrong: b stepped, but the one scale was halved
        "skip the whole step, the clean": ('"b"', '"c"'),  # wrong: picturing one update() per micro-batch
        "Why must update() run once per iteration": ('"c"', '"a"'),  # wrong: expecting torch to refuse the mistake
        "Why must a checkpoint hold scaler.state_dict()": ('"c"', '"b"'),  # wrong: expecting a missing state to raise
        "def train_step": (
            '(__import__("ampviz.training.loopcheck", fromlist=["reference_step"]).reference_step, '
            '__import__("ampviz.training.loopcheck", fromlist=["save_checkpoint"]).save_checkpoint, '
            '__import__("ampviz.training.loopcheck", fromlist=["load_checkpoint"]).load_checkpoint)',
            '(__import__("ampviz.training.loopcheck", fromlist=["mistaken_loop"]).mistaken_loop('
            '"update() after each optimizer")["train_step"], '
            '__import__("ampviz.training.loopcheck", fromlist=["save_checkpoint"]).save_checkpoint, '
            '__import__("ampviz.training.loopcheck", fromlist=["load_checkpoint"]).load_checkpoint)'),
    },
    "06_scaling_lab": {
        'go "up" or "down"': ('"down"', '"up"'),
        "largest growth_interval": ("499", "500"),  # wrong: 500 never completes 500 clean steps in a row
        "Megatron's default hysteresis": ("1", "2"),
        "A fairseq log this lesson did not show": ('"sawtooth"', '"ratchet"'),
        "Why is section 1's sawtooth harmless": ('"b"', '"d"'),  # wrong: taking the ratchet for the scaler adapting
        "are steady, with no spikes, yet": ('"c"', '"b"'),  # wrong: thinking the scale halves on a timer
    },
    "07_live_training": {
        "lose no gradient to underflow at step 0": ('"fp16+scaler"', '"fp16"'),
        "what does 1e-8 become in fp16": ("0", "1e-8"),
        'go "up" or "down"': ('"up"', '"down"'),
        "loses far more of each layer's weight gradients": ('"b"', '"d"'),  # wrong: thinking autocast makes weights fp16
        "diverges at step 1. Why?": ('"b"', '"a"'),  # wrong: blaming overflow, fp16's best-known failure
        "fc1 hardly moves in 100 steps": ('"c"', '"b"'),  # wrong: carrying Adam's eps over to SGD
    },
    "08_lightning_manual_backward": {
        "what is trainer.precision": ('"bf16-mixed"', '"16-mixed"'),
        "Optimizer 2 applies its true gradient times what factor": ("2", "1"),
        "Does opt.step() raise an error": ('"no"', '"yes"'),
        "only optimizer 2's gradients overflow": ("2", "1"),
        "The scale is 32768 after an earlier overflow": ("1 / 32768", "1.0"),
        "_scale is None'. Why?": ('"c"', '"a"'),  # wrong: taking _scale for precision_plugin.scaler, None on the CPU
        "Why does optimizer 2 apply twice its true gradient": ('"b"', '"a"'),  # wrong: "halved once per optimizer"
        "why must self.clip_gradients run in": ('"a"', '"b"'),  # wrong: the error of unscale_(opt.optimizer)
    },
    "09_lightning_autocast_cache": {
        "How many of its six": ("4", "2"),
        "y2 = lin(x) under torch.no_grad() again": ('"no"', '"yes"'),
        "Does the loss change from step to step": ('"no"', '"yes"'),
        "Which of these changes, each made alone": ('"b, d"', '"a, b, d"'),
        "leaves its Linear layer with .grad = None": ('"b"', '"a"'),  # wrong: thinking no_grad freezes the parameters
        "served stale, yet a training loop": ('"b"', '"a"'),  # wrong: thinking the Trainer clears the cache
    },
    "10_lightning_transformer_eval": {
        "all-False padding mask pads nothing": ('"yes"', '"no"'),
        "furthest from fp32": ('"bf16-true"', '"fp32 island"'),
        "num_sanity_val_steps=2": ("0", "8"),
        "fast path in validation all the same": ('"yes"', '"no"'),
        "frozen feature extractor": ('"yes"', '"no"'),
        "crash only when Lightning validates?": ('"c"', '"b"'),  # wrong: blaming inference_mode, which fit does not use
        "under CUDA autocast, the same encoder validates": ('"b"', '"a"'),  # wrong: "it's fixed on my GPU"
    },
    "11a_loss_scaling_across_ranks": {
        "only rank 3's backward overflows": ("4", "1"),  # wrong: only the rank whose own gradients overflowed
        "Each rank's scale after the last step": ("(1024, 4096)", "(1024, 1024)"),  # wrong: DDP's shared scale
        "does NOT make every rank skip": ('"min"', '"avg"'),  # wrong: avg gives 0.25, not 0: every rank skips
        "only rank 1's backward overflows at step 2": ('"b"', '"c"'),  # wrong: thinking GradScaler syncs its flag itself
        "Why does rank 1's scaler not see the inf": ('"a"', '"c"'),  # wrong: thinking the collective drops the inf
    },
    "11b_allreduce_numerics": {
        "fp16_compress_hook at 8 ranks": ("0.575", "0.1"),  # wrong: one rank's share, not any of 8 ranks'
        "instead of gloo's ring order changes": ('"a"', '"c"'),  # wrong: thinking gloo sums exactly
        "makes steps skip that DDP's fp32": ('"b"', '"a"'),  # wrong: blaming fp16's precision, not its range
    },
    "12_fp8_scaling": {
        "For how many steps after the spike is the scale 2^8 lower": ("16", "15"),  # wrong: history_len - 1
        "A tensor's amax is 3.5: what is its scale": ("128", "3.5 / 448"),  # wrong: amax / max, the inverse
        "What share of the finite values becomes 0": ("1.0", "0"),  # wrong: only the inf is hit (TE's scale 1)
        "margin=1: the window's amax is 3.5": ("64", "256"),  # wrong: times 2**margin instead of divided
        "saturates no value at any step": ('"b"', '"a"'),  # wrong: thinking a long enough history foresees a spike
        "HYBRID casts activations and weights to E4M3": ('"c"', '"b"'),  # wrong: forgetting the scale moves any size
        "removes the saturations that drift causes": ('"c"', '"a"'),  # wrong: thinking the margin widens the window
    },
    "13_mx_and_nvfp4": {
        "What does 500 dequantize to": ("448", "512"),  # wrong: the rounded-up (rceil) scale's answer
        "How many of the 31 ones": ("0", "31"),  # wrong: forgetting that the outlier sets the block's scale
        "how many bits per element": ("4 + 8 / 16 + 32 / 4096", "4.5"),  # wrong: the tensor scale's 32 bits forgotten
        "What does 1e-3 dequantize to": ("0", "1e-3"),  # wrong: what the two-level (tensor-scaled) NVFP4 keeps
        "flushes its own block only": ('"a"', '"b"'),  # wrong: crediting small blocks with a finer grid
        "Why does it also need a float32 scale": ('"b"', '"a"'),  # wrong: thinking E2M1 needs it for the block's amax
        "floor rule can clamp a block's largest": ('"c"', '"a"'),  # wrong: taking floor for how the elements are rounded
    },
    "14_fp8_training": {
        "a loss scale of 2^16 leaves every FP8 gradient code": ('"b"', '"a"'),  # wrong: thinking FP8 reaches smaller numbers than fp16
        "torchao's recommended filter keeps the beam model's": ('"b"', '"a"'),  # wrong: thinking the end layers saturate
        "the finer the blocks, the fewer values underflow": ('"b"', '"c"'),  # wrong: crediting the power-of-two scales
    },
}
