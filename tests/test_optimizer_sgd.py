"""``--optimizer sgd`` (Megatron-LM's flag, megatron-core's torch SGD): an SGD run resumes from its
checkpoint to the losses of the uninterrupted run, which megatron-core 0.16 alone cannot do (its
FP32 and float16 optimizers call the ``init_state_fn`` it leaves None for SGD while building the
loading state dict); the state primed for that load is what torch's first SGD step creates; and
the combination megatron-core refuses when it builds the optimizer is refused with the config."""

import pytest
import torch
from helpers import pretrain

from megatron_gamma.config import ConfigError, load_config
from megatron_gamma.training.checkpointing import _sgd_init_state


@pytest.mark.parametrize("momentum", [0.9, 0.0])
def test_the_primed_state_is_the_one_a_first_sgd_step_creates(momentum):
    params = [torch.nn.Parameter(torch.randn(3, 4, dtype=torch.float64)) for _ in range(2)]
    stepped = torch.optim.SGD(params, lr=0.1, momentum=momentum)
    for p in params:
        p.grad = torch.zeros_like(p)
    stepped.step()  # a zero gradient: the buffers hold zeros after the step
    primed = torch.optim.SGD(params, lr=0.1, momentum=momentum)
    _sgd_init_state(primed)
    for p in params:
        assert stepped.state[p].keys() == primed.state[p].keys()
        for key, value in stepped.state[p].items():
            assert torch.equal(primed.state[p][key], value), key
            assert primed.state[p][key].dtype == torch.float64


def test_sgd_with_the_distributed_optimizer_is_refused_with_the_config():
    with pytest.raises(ConfigError) as e:
        load_config(None, {"optimizer": "sgd", "use_distributed_optimizer": True})
    assert "use_distributed_optimizer=True" in str(e.value)
    assert "Fix: --optimizer adam, or leave out --use-distributed-optimizer" in str(e.value)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_an_sgd_run_resumes_to_the_uninterrupted_losses(tmp_path, demo_prefix):
    flags = ["--train-iters", "12", "--eval-interval", "100", "--optimizer", "sgd",
             "--sgd-momentum", "0.9", "--log-diagnostics-interval", "0"]  # fmt: skip
    full = pretrain(tmp_path / "full", demo_prefix, *flags)
    ckpt = str(tmp_path / "ckpt")
    pretrain(tmp_path / "first", demo_prefix, *flags, "--exit-interval", "6", "--save", ckpt)
    resumed = pretrain(tmp_path / "second", demo_prefix, *flags, "--load", ckpt)
    assert sorted(resumed["train"]) == list(range(7, 13))
    for it in range(7, 13):
        assert resumed["train"][it] == full["train"][it], it
