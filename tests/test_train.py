"""The foveated digits network trains through the ops registry (a few short CPU steps)."""

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
