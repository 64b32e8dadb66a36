#!/usr/bin/env bash
# Prints the device flag for the recipes' fairseq commands on this machine: --fp16 where torch sees a CUDA GPU, --cpu
# where it sees none (fairseq-train --fp16 needs a GPU; without --cpu fairseq looks for one). The recipes' settings
# take it as DEVICE=${DEVICE:-$(bash examples/device.sh)}: set DEVICE to choose yourself (--bf16 on GPUs that have
# it, --bf16 --cpu for 16-bit training on a CPU).
exec python -c 'import torch; print("--fp16" if torch.cuda.is_available() else "--cpu")'
