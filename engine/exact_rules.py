"""The exact-reuse rules: how many rows a step must compute of a sequence so that a warm
start gives the cold start's KV and logits bit for bit, and the least settings a
scheduler can run with under them.

Pure arithmetic shared by both sides of the engine: the scheduler (engine thread) plans
with it, and the configuration (engine/settings.py, asked by the server's config
validation through engine/client.py) refuses settings the scheduler could not run.
"""

from __future__ import annotations

# Exact reuse. llama.cpp computes a sequence's rows with other kernels when a step holds
# few of them than when it holds many, so a position's KV and logits depend on the size
# of the step that computed them. Measured on this build with bench/batch_invariance.py
# (default model, a KV stream per slot, repacked weights, prompts of 512..4000 tokens,
# a prompt's last k rows computed again vs the whole prompt in one step):
# - flash attention on: every step of fewer than 64 rows of a sequence differs (max
#   |dlogit| 0.31-0.60), 64+ rows are identical;
# - flash attention off: steps of 2+ rows are identical, a one-row step differs (0.19-0.35);
# - a token decoded one row per step (alone or beside 3 other sequences) has other KV
#   than the same token prefilled: reusing 32 of them moved the next logits by 0.38-0.70
#   (flash attention off).
# So to make a warm start give exactly the cold output, prefill chunks of a prompt of
# `min_rows`+ tokens are never smaller than `min_rows`, each runs alone in its decode
# (engine/thread/runner.py), only prompt positions (never decoded ones) are reused, and at
# least the last `min_rows` prompt tokens are computed again.


# Repacked weights (llama.cpp's CPU "extra" buffers, used where the CPU has no AMX) multiply
# a step's activation rows four at a time and the rest one by one (ggml-cpu/repack.cpp:
# gemm over blocks of 4 rows, gemv for the remainder), and the two paths round apart. So
# a row's KV depends on whether its ubatch put it in a block of four: measured on Gemma 3
# 270M Q4_K_M on an AMD EPYC without flash attention, a prompt whose cold last chunk has 222
# rows (its last 2 in the remainder) differs from every warm start of a 64-row tail (max
# |dlogit| 1.1), and equals one of 66 rows. In exact mode a chunk therefore starts on a
# multiple of EXACT_ROW_BLOCK and only a prompt's last chunk may end off one: the
# remainder rows are then the same positions, the prompt's last `L mod 4`, cold or warm,
# and never reused (placement.reusable). Whole states cannot be cut to a block; they keep
# the plain rule.
EXACT_ROW_BLOCK = 4


# llama.cpp's CPU flash attention (ggml-cpu/ops.cpp, ggml_compute_forward_flash_attn_ext_f16)
# takes its tiled kernel (a small GEMM per tile) only for this many query rows of a KV
# stream in one ubatch (GGML_FA_TILE_Q); fewer go row by row. That is why 64 is the
# exact-reuse bound with flash attention, and why 63 rows over a 2k-token stream cost
# 1.6x what 64 do (bench/step_cost.py, docs/benchmarks.md "Where the rest of the time goes").
FLASH_TILE_ROWS = 64

# Where a warm start's few new rows are padded to that tile (SchedulerConfig.pad_from).
# On an AMD EPYC (2 cores, SmolLM2, flash attention on, 2 streams), one llama_decode of a
# warm chunk of R rows beside a decode row, against the 64-row tile in a decode of its own
# plus the decode row alone, in ms (bench/step_cost.py --tail):
#   stream of 1,024 cells: R=40 254, R=60 367, tile 282;   2,048: 396, 547, 409;
#   4,096: 578, 842, 537;   7,168: 919, 1,358, 985.
# The tile costs what 37-45 rows cost at every length: padding pays from about 48 rows.
PAD_FROM_ROWS = 48
# A sliding-window model's prompt chunk of this many rows gets a decode of its own
# (SchedulerConfig.solo_rows) instead of sharing one with another slot's decode row. On a
# Xeon with AMX (Gemma 3 270M, flash attention, 2 streams), one llama_decode of R rows
# beside a decode row, against R rows alone plus the decode row alone, in ms
# (bench/step_cost.py --window):
#   KV 1,024: R=64 169 / 187, R=128 301 / 282, R=256 549 / 513;
#   4,096: 235 / 250, 401 / 323, 672 / 629;   8,192: 310 / 319, 516 / 407, 900 / 778.
# Sharing pays below 128 rows and costs 7-27% from 128 on (a 16.6k-token prefill in
# 256-row chunks beside one decode row: 54.9 s shared, 47.5 s apart, 45.6 s alone).
WINDOW_SOLO_ROWS = 128
# SchedulerConfig.cpu: which padding rule the load measured for its device.
CPU_TILE_PAYS = "tile pays"
CPU_ROW_BY_ROW = "row by row"
GPU_KERNELS = "gpu"


def exact_min_rows(flash_attn: bool) -> int:
    """The fewest rows of one sequence a step must compute to give exactly the KV and
    logits of one big step (see above): the one home of this rule."""
    return FLASH_TILE_ROWS if flash_attn else 2


def exact_min_chunk(min_rows: int) -> int:
    """The least prefill room per step that exact mode needs: a prompt of
    min_rows+1 .. 2*min_rows-1 pending tokens cannot be cut into two chunks of
    `min_rows`+ rows, so it must fit whole; and a chunk that does not end the prompt
    ends on a row block, which can take up to EXACT_ROW_BLOCK - 1 rows more room. With
    less room such a prompt would wait for ever (refused at construction instead)."""
    return 2 * min_rows + EXACT_ROW_BLOCK - 2


# The least settings a scheduler works with; the server's config validation asks these
# too, so a configuration it accepts is one the engine can run (issue 17).
def least_step_tokens(num_slots: int, exact: bool, min_rows: int) -> int:
    """A row per slot; in exact mode the oldest prefilling sequence shares the step with
    at most num_slots - 1 decode rows and must still get exact_min_chunk(min_rows)."""
    return exact_min_chunk(min_rows) + num_slots - 1 if exact else num_slots


def least_prefill_chunk(exact: bool, min_rows: int) -> int:
    return exact_min_chunk(min_rows) if exact else 1
