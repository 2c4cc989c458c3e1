"""One chat SFT run (LoRA, packed), on a fleet data-parallel layout when STRATEGY is given: the
script tests/test_chat_sft.py runs on 2 gloo ranks and alone, to compare the two.

    python chat_sft_fleet.py BASE_DIR DATA OUT [STRATEGY_JSON]
"""

import json
import sys

import torch.distributed as dist

from sampan.finetune import FinetuneConfig, finetune

base, data, out = sys.argv[1:4]
strategy = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
ranks = 2 if strategy else 1
result = finetune(FinetuneConfig(
    task="chat", model=base, data=data, method="lora", max_length=160,
    training={"output_dir": out, "max_steps": 4, "per_device_train_batch_size": 4 // ranks,
              "per_device_eval_batch_size": 4 // ranks, "learning_rate": 1e-2, "lr_scheduler": "constant",
              "logging_steps": 1, "progress_bar": False, "tensorboard": False, "strategy": strategy}))
print("RESULT " + json.dumps({"initial": result.initial_dev_metrics, "final": result.metrics}))
if dist.is_initialized():
    dist.destroy_process_group()
