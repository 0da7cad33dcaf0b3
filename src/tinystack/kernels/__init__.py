"""The speed code: every C++ extension, its thin Python binding, one build rule and one reader of the CPU.

    build.py            build(name, sources, ...): compile at first use, cache by source hash, None (one warning)
                        where no compiler can; every extension below loads through it
    cpu.py              flags(), has_amx(), identity(): the CPU's features, read in one place
    fused_ops.py        Llama's RMSNorm / rotary + q/k/v split / SwiGLU / residual add, one C++ pass each way
      + fused_ops.cpp, fused_ops.h, cross_entropy_rows.cpp (the training loss's rows)      (bf16 training)
    fused_attention.py  causal attention for bf16 training: bf16 matmuls around C++ softmax passes
      + fused_attention.cpp
    matmul_plan.py      each training product timed once per shape: one library call or rows split over threads
      + linear_ops.cpp  (rows_mm and LoRA's library-call product)
    lora_amx.py         LoRA's product fused in AMX tiles, on CPUs with AMX BF16
      + lora_amx.cpp, amx_tiles.h
    quant/              the quantised-weight kernels (matmul for packed weights, the packer, the fused decode step)

A module here binds a kernel and says what it computes; when a layer uses it stays in that layer (model/llama.py,
train/lora.py, infer/quant/kernels.py, infer/fused_step.py), and each fast path states what it supports as data
and refuses anything else, so the reference path runs instead.
"""
