"""Worker for tests/test_recipes.py.

``meta RECIPE...``: build each recipe (and its dense/MoE, gated/ungated variants) on the meta
device through the real model builder under the launch's TP size (world size), and report this
rank's parameter count next to the estimator's.
``memory RECIPE DATA``: train the recipe for two iterations at a reduced batch on the CPU and
report the process's peak RSS growth over its size just before the model was built, next to the
estimator's per-GPU total.
"""

import os
import resource
import sys
import tempfile

import psutil
import torch
import torch.distributed as dist
from common import write_result
from megatron.core import parallel_state

from megatron_gamma import parallel
from megatron_gamma.config import load_config
from megatron_gamma.estimate import count_parameters, estimate_memory, params_per_gpu
from megatron_gamma.model.builder import build_model_chunk, padded_vocab_size, transformer_config

VARIANTS = {
    "default": {},
    "no-gate": {"gated_attention": "none"},
    "headwise": {"gated_attention": "headwise"},
}


def meta(recipes):
    out = {}
    tp = int(os.environ["WORLD_SIZE"])
    for recipe in recipes:
        for variant, overrides in VARIANTS.items():
            cfg = load_config(
                recipe,
                {
                    **overrides,
                    "tensor_model_parallel_size": tp,
                    "expert_model_parallel_size": 1,
                    "init_method": "normal",
                },
            )
            if parallel_state.model_parallel_is_initialized():
                parallel_state.destroy_model_parallel()
            parallel.initialize(cfg)
            vocab = padded_vocab_size(cfg.model.vocab_size, cfg)
            with torch.device("meta"):
                model, _ = build_model_chunk(cfg, transformer_config(cfg, on_gpu=False), vocab)
            local = sum(p.numel() for p in model.parameters())
            out[f"{recipe}|{variant}"] = {
                "local_numel": local,
                "estimated_local": params_per_gpu(cfg, vocab)["first"],
                "estimated_total": count_parameters(cfg, vocab).total,
                "active": count_parameters(cfg, vocab).active,
            }
    return out


def memory(recipe, data_prefix, tokenizer):
    from megatron_gamma.training.loop import Trainer

    overrides = {
        "bf16": False,
        "micro_batch_size": 1,
        "global_batch_size": 1,
        "seq_length": 512,
        "train_iters": 2,
        "eval_interval": 1000,
        "eval_iters": 1,
        "data_path": [data_prefix],
        "split": "95,5,0",
        "tokenizer_model": tokenizer,
        "save": "",
        "load": "",
        "log_diagnostics_interval": 0,
        "run_dir": tempfile.mkdtemp(),
        "progress_bar": False,
    }
    cfg = load_config(recipe, overrides)
    before = psutil.Process().memory_info().rss
    trainer = Trainer(cfg)
    trainer.train()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    est = estimate_memory(cfg, trainer.vocab_size, dist.get_world_size())
    return {
        "measured": peak - before,
        "estimated": est.total(cfg.parallel.use_distributed_optimizer, False),
        "parts": vars(est),
    }


if __name__ == "__main__":
    if sys.argv[1] == "meta":
        write_result(meta(sys.argv[2:]))
    else:
        write_result(memory(*sys.argv[2:]))
