"""The foveated digits network trains through the ops registry (a few short CPU steps)."""

import pytest
import torch

from fovi_lab.train import FoveatedDigitsNet, load_digits_tensors, train_digits


def test_digits_are_sampled_through_the_retina():
    xtr, ytr, xte, yte = load_digits_tensors(size=32)
    assert xtr.shape[1:] == (1, 32, 32) and len(xtr) + len(xte) == 1797
    net = FoveatedDigitsNet()
    x = net.sample(xtr[:4])
    assert x.shape == (4, 1, net.graphs[0].nin)
    assert 0 <= float(x.min()) and float(x.max()) <= 1


def test_a_few_steps_reduce_the_loss():
    r = train_digits("torch_compact", steps=25, batch=64, log_every=5)
    assert r.loss[-1] < r.loss[0] - 0.2
    assert r.test_accuracy > 0.2  # well above chance (0.1) after 25 steps


def test_param_digest_tells_bitwise_equal_parameters_apart():
    import torch
    from fovi_lab.train import param_digest

    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    b.load_state_dict(a.state_dict())
    assert param_digest(a) == param_digest(b) and len(param_digest(a)) == 64
    with torch.no_grad():
        b.weight[0, 0] = torch.nextafter(b.weight[0, 0], torch.tensor(2.0))     # one ulp
    assert param_digest(a) != param_digest(b)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"backend": "nope"}, ValueError, "^backend: unknown 'nope'; registered backends that train: "),
    ({"backend": "warp_compact"}, ValueError, "^backend: 'warp_compact' is forward-only; expected a backend that "),
    ({"backend": 3}, TypeError, "^backend: expected a backend name"),
    ({"steps": 0}, ValueError, "^steps: expected an integer >= 1, got 0$"),
    ({"batch": 2.5}, ValueError, r"^batch: expected an integer >= 1, got 2\.5$"),
    ({"lr": 0.0}, ValueError, r"^lr: expected a number > 0, got 0\.0$"),
    ({"lr": float("nan")}, ValueError, "^lr: expected a number > 0, got nan$"),
], ids=lambda v: str(v) if isinstance(v, dict) else "")
def test_train_digits_names_a_bad_argument_before_it_trains(kwargs, error, match):
    """The Python API checks what the command line checks (a forward-only backend used to fail at the first
    backward, zero steps to return an empty run), each error naming the argument."""
    with pytest.raises(error, match=match):
        train_digits(**{"steps": 1, **kwargs})


def test_train_digits_takes_numpy_numbers():
    """A widget or a sweep may hand numpy scalars: integers and reals of any kind pass the checks."""
    import numpy as np
    r = train_digits("torch_compact", steps=np.int64(1), batch=np.int32(8), lr=np.float32(1e-2), log_every=1)
    assert len(r.loss) == 1
